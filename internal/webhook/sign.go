package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// The Standard Webhooks headers of a delivery (https://www.standardwebhooks.com/).
const (
	// HeaderID is the message's id: the same on every attempt, so that receivers deduplicate.
	HeaderID = "webhook-id"
	// HeaderTimestamp is the attempt's time in unix seconds: signed, so that receivers refuse
	// a request replayed later than their tolerance.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature is a space-separated list of "v1,<base64 HMAC-SHA256>": several while a
	// secret is rotated; a receiver accepts any one that verifies.
	HeaderSignature = "webhook-signature"
)

const (
	// SecretPrefix starts a secret's text form, so that people and secret scanners know one.
	SecretPrefix = "whsec_"
	// MinSecretBytes and MaxSecretBytes bound a secret's key, as the specification does: fewer
	// than 24 random bytes is guessable, and receivers' libraries refuse more than 64.
	MinSecretBytes = 24
	MaxSecretBytes = 64
	// DefaultTolerance is how far from the receiver's clock Verify accepts a timestamp when
	// told 0: the specification's five minutes, for clocks that drift and requests that queue.
	DefaultTolerance = 5 * time.Minute
	// signatureVersion marks an HMAC-SHA256 signature; the specification's asymmetric "v1a"
	// ones are not made, and Verify skips them.
	signatureVersion = "v1"
)

// ErrUnverified is wrapped by every error of Verify: the request is not one the secret's
// holder signed, or not recently.
var ErrUnverified = errors.New("webhook not verified")

// Secret is an endpoint's signing key, shared with its receiver. Its String hides the key, so
// that logging an Endpoint does not leak it; Text is the whsec_ form, to store and to show the
// endpoint's owner once. The zero Secret is no secret: Validate refuses it.
type Secret struct{ key []byte }

// NewSecret returns a new random secret of MinSecretBytes bytes from crypto/rand.
func NewSecret() (Secret, error) {
	key := make([]byte, MinSecretBytes)
	if _, err := rand.Read(key); err != nil {
		return Secret{}, fmt.Errorf("new webhook secret: %w", err)
	}
	return Secret{key: key}, nil
}

// ParseSecret parses "whsec_<standard base64 of 24 to 64 bytes>". Its error is a *field.Error
// naming "secret", and never repeats the secret.
func ParseSecret(s string) (Secret, error) {
	b64, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return Secret{}, field.Errorf("secret", "must start with %q", SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return Secret{}, field.Errorf("secret", "must be %q then standard base64: %v", SecretPrefix, err)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return Secret{}, field.Errorf("secret", "must hold %d to %d bytes, got %d", MinSecretBytes, MaxSecretBytes, len(key))
	}
	return Secret{key: key}, nil
}

// IsZero reports whether s is no secret.
func (s Secret) IsZero() bool { return len(s.key) == 0 }

// Text is the secret as ParseSecret reads it: "whsec_<base64>".
func (s Secret) Text() string {
	if s.IsZero() {
		return ""
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(s.key)
}

// String hides the key: "whsec_…", or "" for no secret.
func (s Secret) String() string {
	if s.IsZero() {
		return ""
	}
	return SecretPrefix + "…"
}

// MarshalText is Text, for the integrator's stored endpoints (JSON, a KV bucket).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.Text()), nil }

// UnmarshalText is ParseSecret; empty text is no secret.
func (s *Secret) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*s = Secret{}
		return nil
	}
	p, err := ParseSecret(string(b))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Sign returns the webhook-signature value of one attempt: "v1,<base64 of HMAC-SHA256 over
// "<id>.<unix seconds of at>.<body>" keyed with the secret>".
func Sign(secret Secret, id string, at time.Time, body []byte) string {
	return signatureVersion + "," + base64.StdEncoding.EncodeToString(mac(secret, id, at.Unix(), body))
}

// mac is the raw HMAC-SHA256 of id.timestamp.body.
func mac(secret Secret, id string, unix int64, body []byte) []byte {
	h := hmac.New(sha256.New, secret.key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(strconv.AppendInt(nil, unix, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify is what a receiver does with a request: it accepts it when webhook-timestamp is
// within tolerance of now (DefaultTolerance when 0) and one of webhook-signature's v1
// signatures is the secret's over webhook-id, webhook-timestamp and body, compared in
// constant time. Its error is a *field.Error naming the header at fault (or "secret") and
// wrapping ErrUnverified.
func Verify(secret Secret, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if secret.IsZero() {
		return unverified("secret", "required")
	}
	id := h.Get(HeaderID)
	if id == "" {
		return unverified(HeaderID, "missing")
	}
	unix, err := strconv.ParseInt(h.Get(HeaderTimestamp), 10, 64)
	if err != nil {
		return unverified(HeaderTimestamp, "want unix seconds, got %q", h.Get(HeaderTimestamp))
	}
	switch at := time.Unix(unix, 0); {
	case now.Sub(at) > tolerance:
		return unverified(HeaderTimestamp, "%v old, more than the tolerance of %v", now.Sub(at).Round(time.Second), tolerance)
	case at.Sub(now) > tolerance:
		return unverified(HeaderTimestamp, "%v in the future, more than the tolerance of %v", at.Sub(now).Round(time.Second), tolerance)
	}
	sigs := strings.Fields(strings.Join(h.Values(HeaderSignature), " "))
	if len(sigs) == 0 {
		return unverified(HeaderSignature, "missing")
	}
	want := mac(secret, id, unix, body)
	for _, sig := range sigs {
		version, b64, _ := strings.Cut(sig, ",")
		if version != signatureVersion {
			continue
		}
		if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return unverified(HeaderSignature, "no %s signature matches", signatureVersion)
}

// unverified is a field.Error of Verify, wrapping ErrUnverified.
func unverified(name, format string, args ...any) error {
	return &field.Error{Field: name, Msg: fmt.Sprintf(format, args...), Err: ErrUnverified}
}
