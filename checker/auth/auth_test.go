package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

const callers = `
anonymous: {permissions: [check]}
callers:
  - {name: orders-api, token: orders-api-token-0001, permissions: [check]}
  - {name: edge, token: edge-gateway-token-0001, permissions: [check, assert-tier]}
  - {name: ops, certificate: ops.internal, permissions: [reset]}
`

func mustLoad(t *testing.T, doc string) *Registry {
	t.Helper()
	r := new(Registry)
	if err := r.Load([]byte(doc)); err != nil {
		t.Fatal(err)
	}
	return r
}

func certState(cn string, dns ...string) *tls.ConnectionState {
	return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: cn}, DNSNames: dns}}}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	r := mustLoad(t, callers)
	r.SetAdminTokens(map[string]string{"admin-write-token-0001": "alice-ops"})
	none := new(Registry)
	tests := []struct {
		name      string
		reg       *Registry
		authz     string
		state     *tls.ConnectionState
		wantName  string
		wantCan   []Permission
		wantCant  []Permission
		wantError string
	}{
		{"no callers file: anonymous checks", none, "", nil, Anonymous, []Permission{Check}, []Permission{AssertTier, Reset}, ""},
		{"anonymous from the file", r, "", nil, Anonymous, []Permission{Check}, []Permission{AssertTier, Reset}, ""},
		{"service token", r, "Bearer orders-api-token-0001", nil, "orders-api", []Permission{Check}, []Permission{AssertTier, Reset}, ""},
		{"scheme is case-insensitive", r, "bearer edge-gateway-token-0001", nil, "edge", []Permission{Check, AssertTier}, []Permission{Reset}, ""},
		{"admin write token", r, "Bearer admin-write-token-0001", nil, "alice-ops", []Permission{Check, AssertTier, Reset, Admin}, nil, ""},
		{"admin token without a file", func() *Registry {
			n := new(Registry)
			n.SetAdminTokens(map[string]string{"admin-write-token-0001": "alice-ops"})
			return n
		}(), "Bearer admin-write-token-0001", nil, "alice-ops", []Permission{Reset}, nil, ""},
		{"client certificate by CN", r, "", certState("ops.internal"), "ops", []Permission{Reset}, []Permission{Check}, ""},
		{"client certificate by DNS name", r, "", certState("x", "ops.internal"), "ops", []Permission{Reset}, nil, ""},
		{"unknown token", r, "Bearer nope-nope-nope-nope", nil, "", nil, nil, "unknown token"},
		{"not bearer", r, "Basic dXNlcjpwYXNz", nil, "", nil, nil, "want Authorization: Bearer"},
		{"unknown certificate", r, "", certState("stranger"), "", nil, nil, `"stranger" is no caller's`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := tt.reg.Authenticate(tt.authz, tt.state)
			if tt.wantError != "" {
				if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("Authenticate = %v, %v; want ErrUnauthenticated with %q", c, err, tt.wantError)
				}
				return
			}
			if err != nil || c.Name != tt.wantName {
				t.Fatalf("Authenticate = %v, %v; want %s", c, err, tt.wantName)
			}
			for _, p := range tt.wantCan {
				if !c.Can(p) {
					t.Errorf("%s cannot %s", c.Name, p)
				}
			}
			for _, p := range tt.wantCant {
				if c.Can(p) {
					t.Errorf("%s can %s", c.Name, p)
				}
			}
		})
	}
}

// TestLoadErrorWords: the callers file's errors name the line and say what was expected in
// words, never a Go type (they printed "cannot unmarshal !!map into []struct { Name string
// "yaml:\"name\""; ... }").
func TestLoadErrorWords(t *testing.T) {
	t.Parallel()
	tests := []struct{ doc, want string }{
		{"# callers\n\ncallers:\n  orders: {token: aaaaaaaaaaaaaaaa}\n", "line 4: callers: want a list, got a mapping"},
		{"callers:\n  - orders\n", "line 2: callers[0]: want a mapping of fields, got a single value"},
		{"anonymous: [check]\n", "line 1: anonymous: want a mapping of fields, got a list"},
		{"callers:\n  - name: a\n    token: aaaaaaaaaaaaaaaa\n    permissions: check\n", "line 4: callers[0].permissions: want a list, got a single value"},
		{"caller:\n  - {name: a}\n", `line 1: unknown field "caller" (did you mean "callers"?)`},
		{"callers:\n  - name: a\n    token: short\n    permissions: [check]\n", "line 3: callers[0].token: want at least 16 characters"},
		{"callers:\n  - name: a\n    token: aaaaaaaaaaaaaaaa\n    permissions: [check, god]\n", "line 4: callers[0].permissions[1]: want one of"},
		{"callers:\n  - name: a\n    permissions: [check]\n", "line 2: callers[0]: want one of token and certificate"},
		{"callers:\n  - {name: a, token: aaaaaaaaaaaaaaaa, permissions: [check]\n", "line 2: did not find expected ',' or '}'"},
	}
	for _, tt := range tests {
		var r Registry
		err := r.Load([]byte(tt.doc))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "struct") {
			t.Errorf("Load(%q) = %v, want %q", tt.doc, err, tt.want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ doc, want string }{
		{"callers: [{name: a, token: short, permissions: [check]}]", "callers[0].token: want at least 16 characters"},
		{"callers: [{name: a, token: aaaaaaaaaaaaaaaa, certificate: x, permissions: [check]}]", "callers[0]: want one of token and certificate"},
		{"callers: [{token: aaaaaaaaaaaaaaaa, permissions: [check]}]", "callers[0].name: required"},
		{"callers: [{name: a, token: aaaaaaaaaaaaaaaa}]", "callers[0].permissions: required"},
		{"callers: [{name: a, token: aaaaaaaaaaaaaaaa, permissions: [god]}]", `callers[0].permissions[0]: want one of`},
		{"callers: [{name: a, token: aaaaaaaaaaaaaaaa, permissions: [check]}, {name: a, token: bbbbbbbbbbbbbbbb, permissions: [check]}]", `callers[1].name: "a" is listed twice`},
		{"callers: [{name: a, token: aaaaaaaaaaaaaaaa, permissions: [check]}, {name: b, token: aaaaaaaaaaaaaaaa, permissions: [check]}]", "callers[1].token: the same token"},
		{"callers: [{name: anonymous, token: aaaaaaaaaaaaaaaa, permissions: [check]}]", "use anonymous: for them"},
		{"anonymous: {permissions: [everything]}", "anonymous.permissions[0]"},
		{"callers: [{name: a, tokn: x}]", `unknown field "tokn" (did you mean "token"?)`},
	}
	for _, tt := range tests {
		r := mustLoad(t, callers)
		err := r.Load([]byte(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Load(%s) = %v, want an error with %q", tt.doc, err, tt.want)
		}
		// A refused file changes nothing.
		if c, err := r.Authenticate("Bearer orders-api-token-0001", nil); err != nil || c.Name != "orders-api" {
			t.Errorf("after a refused file: %v, %v; want the callers in force", c, err)
		}
	}
}

// TestFollow: a changed callers file is reloaded; a broken one keeps the callers in force.
func TestFollow(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "callers.yaml")
	write := func(doc string) {
		if err := os.WriteFile(path+".tmp", []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil { // as a ConfigMap update swaps the file
			t.Fatal(err)
		}
	}
	write(callers)
	r := mustLoad(t, callers)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Follow(ctx, path, 10*time.Millisecond, slog.New(slog.DiscardHandler))
	write("callers: [{name: rotated, token: rotated-token-000001, permissions: [check]}]\n")
	poll.Until(t, 5*time.Second, "the rotated token works and the old one no longer does", poll.True(func() bool {
		_, oldErr := r.Authenticate("Bearer orders-api-token-0001", nil)
		c, err := r.Authenticate("Bearer rotated-token-000001", nil)
		return oldErr != nil && err == nil && c.Name == "rotated"
	}))
	write("callers: [{name: broken\n")
	time.Sleep(100 * time.Millisecond)
	if c, err := r.Authenticate("Bearer rotated-token-000001", nil); err != nil || c.Name != "rotated" {
		t.Errorf("after a broken file: %v, %v; want the callers in force", c, err)
	}
}
