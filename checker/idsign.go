package checker

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/redis/go-redis/v9"
)

// The ids of reservations and concurrency leases name the server's own records (the slots of a
// reservation, the places and TTLs of a lease), and whoever holds one may settle, cancel,
// release or renew what it names. So an id is signed: it ends in a MAC, keyed by a secret the
// checkers share, over the id's kind, the caller it was issued to and its fields. An id altered
// in any field (a reservation's slot list split, a lease's TTL raised) or presented by another
// caller does not verify, and is refused before any record is read. What the stream and the
// audit keep of an id is its digest (IDDigest), so that reading them gives no id to present.

// ErrIDNotIssued is an id that does not verify: altered, or issued to another caller (or by
// checkers with other keys). It is refused before anything is read or changed.
var ErrIDNotIssued = errors.New("not issued to this caller: altered, or another caller's")

// idKinds keep a reservation's MAC from verifying as a lease's.
const (
	idKindReservation = "rsv"
	idKindLease       = "lease"
)

// macLen is the length of an id's MAC: 128 bits of HMAC-SHA256, base64url.
const macLen = 22

// idKeyName is where the checkers keep their shared key in Redis when none is configured
// (Config.IDKeys): created by the first checker that needs it, read by the others.
const idKeyName = "rl:{quotaflow}:id-key"

// CallerFunc names the caller of a request from its context (the callers file's name, the
// certificate's, "anonymous"): who an id is issued to and who may use it.
type CallerFunc func(ctx context.Context) string

// idSigner signs and verifies ids. Its keys are Config.IDKeys (the first signs, every one
// verifies, so that keys rotate without refusing ids in flight), else the key kept in Redis,
// read once.
type idSigner struct {
	keys     [][]byte
	rdb      redis.UniversalClient
	callerOf CallerFunc

	mu     sync.Mutex
	shared []byte // from Redis, once read
}

// keyring returns the keys, reading (or creating) the shared one in Redis the first time.
func (s *idSigner) keyring(ctx context.Context) ([][]byte, error) {
	if len(s.keys) > 0 {
		return s.keys, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared != nil {
		return [][]byte{s.shared}, nil
	}
	if s.rdb == nil {
		return nil, fmt.Errorf("%w: no key to sign ids with", ErrUnavailable)
	}
	var fresh [32]byte
	_, _ = rand.Read(fresh[:])
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// Never expires: ids in flight must verify after any restart.
	if err := s.rdb.SetNX(ctx, idKeyName, hex.EncodeToString(fresh[:]), 0).Err(); err != nil {
		return nil, fmt.Errorf("%w: id key: %w", ErrUnavailable, err)
	}
	v, err := s.rdb.Get(ctx, idKeyName).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: id key: %w", ErrUnavailable, err)
	}
	s.shared = []byte(v)
	return [][]byte{s.shared}, nil
}

// caller is who ctx's request came from, "" without a CallerFunc (the engine used as a
// library: every id is then the one caller's).
func (s *idSigner) caller(ctx context.Context) string {
	if s.callerOf == nil {
		return ""
	}
	return s.callerOf(ctx)
}

// mac is the MAC of body, an id of kind issued to caller, under key.
func mac(key []byte, kind, caller, body string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(caller))
	h.Write([]byte{0})
	h.Write([]byte(body))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))[:macLen]
}

// sign returns body, an id of kind for ctx's caller, with its MAC: "<body>.<mac>".
func (s *idSigner) sign(ctx context.Context, kind, body string) (string, error) {
	keys, err := s.keyring(ctx)
	if err != nil {
		return "", err
	}
	return body + "." + mac(keys[0], kind, s.caller(ctx), body), nil
}

// verify returns the body of id, an id of kind, when its MAC is one of the keys' for ctx's
// caller; else an error naming the field name that wraps ErrIDNotIssued (or ErrUnavailable when no key
// can be read).
func (s *idSigner) verify(ctx context.Context, kind, name, id string) (string, error) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 || len(id)-i-1 != macLen {
		return "", field.Errorf(name, "not an id this service issued: no signature")
	}
	body, got := id[:i], id[i+1:]
	keys, err := s.keyring(ctx)
	if err != nil {
		return "", err
	}
	caller := s.caller(ctx)
	for _, k := range keys {
		if hmac.Equal([]byte(got), []byte(mac(k, kind, caller, body))) {
			return body, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, ErrIDNotIssued)
}

// IDDigest is what the decision stream and the audit keep of a reservation's or lease's id: 128
// bits of its SHA-256, hex. It joins a reserve's row with its settle's, and cannot be presented
// as the id.
func IDDigest(id string) string {
	if id == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}
