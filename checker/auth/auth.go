// Package auth says who calls the check API and what each caller may do. Callers prove who they
// are with a bearer token or a TLS client certificate; each has permissions: check (ask for a
// decision), assert-tier (name the tier a check is decided under, for trusted gateways), reset
// (clear a subject's counters) and admin (everything). docs/security.md has the threat model.
//
// Without a callers file, every caller may check, as before callers existed, nobody may assert
// a tier, and reset needs an admin API write token.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quotaflow/quotaflow/internal/bearer"
	"github.com/quotaflow/quotaflow/internal/retry"
	"github.com/quotaflow/quotaflow/internal/yamldoc"
)

// Permission is what a caller may do.
type Permission string

// The permissions.
const (
	Check      Permission = "check"
	AssertTier Permission = "assert-tier"
	Reset      Permission = "reset"
	Admin      Permission = "admin"
)

var permissions = []Permission{Check, AssertTier, Reset, Admin}

// Anonymous is the name of the caller without credentials.
const Anonymous = "anonymous"

// Caller is an authenticated caller, or the anonymous one.
type Caller struct {
	// Name names the caller in logs and errors; "anonymous" without credentials.
	Name        string
	Permissions []Permission
}

// Can reports whether c has p; admin has every permission.
func (c Caller) Can(p Permission) bool {
	return slices.Contains(c.Permissions, p) || slices.Contains(c.Permissions, Admin)
}

// ErrUnauthenticated is credentials that name no caller: an unknown token, or a client
// certificate that is no caller's.
var ErrUnauthenticated = errors.New("unauthenticated")

// Registry holds the callers. Authenticate is safe for concurrent use with Load and
// SetAdminTokens, which swap the callers atomically.
type Registry struct {
	file  atomic.Pointer[table] // the callers file's; nil: none configured
	admin atomic.Pointer[[]tokenEntry]
}

type table struct {
	source    [sha256.Size]byte // of the file loaded
	tokens    []tokenEntry
	certs     map[string]Caller // by certificate subject CN or DNS name
	anonymous Caller
}

type tokenEntry struct {
	digest [sha256.Size]byte
	caller Caller
}

// SetAdminTokens makes each token (token → name) an admin caller: the admin API's write
// tokens, so that reset is authenticated as the admin API is.
func (r *Registry) SetAdminTokens(tokens map[string]string) {
	entries := make([]tokenEntry, 0, len(tokens))
	for tok, name := range tokens {
		entries = append(entries, tokenEntry{digest: sha256.Sum256([]byte(tok)), caller: Caller{Name: name, Permissions: []Permission{Admin}}})
	}
	r.admin.Store(&entries)
}

// Authenticate returns the caller that authorization (the Authorization header's value, "" for
// none) and the TLS state (nil without TLS, or without a client certificate) name. Without
// credentials it is the anonymous caller: allowed to check when no callers file is loaded,
// else what the file's anonymous: entry allows. A token is looked up in constant time over
// every caller's, so that timing tells nothing of any token.
func (r *Registry) Authenticate(authorization string, state *tls.ConnectionState) (Caller, error) {
	t := r.file.Load()
	if authorization != "" {
		tok, ok := bearer.Token(authorization)
		if !ok {
			return Caller{}, fmt.Errorf("%w: want Authorization: Bearer <token>", ErrUnauthenticated)
		}
		digest := sha256.Sum256([]byte(tok))
		var found *Caller
		if t != nil {
			found = lookup(t.tokens, digest, found)
		}
		if a := r.admin.Load(); a != nil {
			found = lookup(*a, digest, found)
		}
		if found == nil {
			return Caller{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
		}
		return *found, nil
	}
	if state != nil && len(state.PeerCertificates) > 0 {
		cert := state.PeerCertificates[0]
		if t != nil {
			for _, name := range append([]string{cert.Subject.CommonName}, cert.DNSNames...) {
				if c, ok := t.certs[name]; ok && name != "" {
					return c, nil
				}
			}
		}
		return Caller{}, fmt.Errorf("%w: client certificate %q is no caller's", ErrUnauthenticated, cert.Subject.CommonName)
	}
	if t == nil {
		return Caller{Name: Anonymous, Permissions: []Permission{Check}}, nil
	}
	return t.anonymous, nil
}

// lookup compares digest with every entry's, in constant time each, and returns the match.
func lookup(entries []tokenEntry, digest [sha256.Size]byte, found *Caller) *Caller {
	for i := range entries {
		if subtle.ConstantTimeCompare(entries[i].digest[:], digest[:]) == 1 {
			found = &entries[i].caller
		}
	}
	return found
}

// file is a callers file.
type file struct {
	Anonymous struct {
		Permissions []Permission `yaml:"permissions"`
	} `yaml:"anonymous"`
	Callers []struct {
		Name        string       `yaml:"name"`
		Token       string       `yaml:"token"`
		Certificate string       `yaml:"certificate"`
		Permissions []Permission `yaml:"permissions"`
	} `yaml:"callers"`
}

// LoadFile is Load of the callers file at path; its errors name the file.
func (r *Registry) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err == nil {
		err = r.Load(data)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Load replaces the callers with those of a callers file (YAML):
//
//	anonymous: {permissions: [check]}       # callers without credentials (default: none)
//	callers:
//	  - {name: orders-api, token: "…", permissions: [check]}
//	  - {name: edge-gateway, token: "…", permissions: [check, assert-tier]}
//	  - {name: ops, certificate: ops.internal, permissions: [reset]}  # CN or DNS name
//
// A file with any problem changes nothing; the error names the entry and the field.
func (r *Registry) Load(data []byte) error {
	var f file
	lines, err := yamldoc.Decode(data, &f)
	if err != nil {
		return err
	}
	// fail names the line of path, or else of the caller it belongs to.
	fail := func(path, format string, args ...any) error {
		line := lines[path]
		if line == 0 {
			line = lines[strings.SplitN(path, ".", 2)[0]]
		}
		msg := path + ": " + fmt.Sprintf(format, args...)
		if line > 0 {
			msg = fmt.Sprintf("line %d: %s", line, msg)
		}
		return errors.New(msg)
	}
	t := &table{source: sha256.Sum256(data), certs: map[string]Caller{}, anonymous: Caller{Name: Anonymous}}
	if err := checkPermissions(fail, "anonymous.permissions", f.Anonymous.Permissions); err != nil {
		return err
	}
	t.anonymous.Permissions = f.Anonymous.Permissions
	names := map[string]bool{}
	digests := map[[sha256.Size]byte]bool{}
	for i, c := range f.Callers {
		where := fmt.Sprintf("callers[%d]", i)
		switch {
		case c.Name == "":
			return fail(where+".name", "required")
		case c.Name == Anonymous:
			return fail(where+".name", "%q names the callers without credentials; use anonymous: for them", c.Name)
		case names[c.Name]:
			return fail(where+".name", "%q is listed twice", c.Name)
		case (c.Token == "") == (c.Certificate == ""):
			return fail(where, "want one of token and certificate")
		case c.Token != "" && len(c.Token) < 16:
			return fail(where+".token", "want at least 16 characters")
		case len(c.Permissions) == 0:
			return fail(where+".permissions", "required, some of %v", permissions)
		}
		if err := checkPermissions(fail, where+".permissions", c.Permissions); err != nil {
			return err
		}
		names[c.Name] = true
		caller := Caller{Name: c.Name, Permissions: c.Permissions}
		if c.Token != "" {
			d := sha256.Sum256([]byte(c.Token))
			if digests[d] {
				return fail(where+".token", "the same token as another caller's")
			}
			digests[d] = true
			t.tokens = append(t.tokens, tokenEntry{digest: d, caller: caller})
			continue
		}
		if _, dup := t.certs[c.Certificate]; dup {
			return fail(where+".certificate", "%q is another caller's", c.Certificate)
		}
		t.certs[c.Certificate] = caller
	}
	r.file.Store(t)
	return nil
}

func checkPermissions(fail func(path, format string, args ...any) error, where string, ps []Permission) error {
	for i, p := range ps {
		if !slices.Contains(permissions, p) {
			return fail(fmt.Sprintf("%s[%d]", where, i), "want one of %v, got %q", permissions, p)
		}
	}
	return nil
}

type ctxKey struct{}

// Result is what authenticating a request gave: a caller, or why not.
type Result struct {
	Caller Caller
	Err    error
}

// WithResult returns ctx carrying the outcome of authenticating its request.
func WithResult(ctx context.Context, r Result) context.Context {
	return context.WithValue(ctx, ctxKey{}, r)
}

// ResultFrom returns what WithResult stored, and whether it did.
func ResultFrom(ctx context.Context) (Result, bool) {
	r, ok := ctx.Value(ctxKey{}).(Result)
	return r, ok
}

// Follow reloads the callers file at path whenever its content differs from the file last
// loaded, checking every interval, until ctx ends. A file that fails to load keeps the callers
// in force and is logged (once per content), as is every reload.
func (r *Registry) Follow(ctx context.Context, path string, interval time.Duration, log *slog.Logger) {
	var refused [sha256.Size]byte
	for retry.Sleep(ctx, interval) {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // a file being replaced may be missing for an instant
		}
		sum := sha256.Sum256(data)
		if t := r.file.Load(); (t != nil && t.source == sum) || sum == refused {
			continue
		}
		if err := r.Load(data); err != nil {
			refused = sum
			log.Error("callers file not reloaded; the callers in force stay", "file", path, "err", err)
			continue
		}
		log.Info("callers file reloaded", "file", path)
	}
}
