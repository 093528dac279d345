package checker

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// ErrIdempotencyConflict is wrapped by the error of a check whose idempotency key was already
// used by the same subjects, within its 5 minutes, for another request: another endpoint, cost
// or asserted tier. (Under other subjects a key is another key.) The error is also a
// *field.Error on "idempotency_key", so transports answer it as a broken request
// (InvalidArgument; HTTP 409 where a conflict has a status of its own).
//
// A key replays an allowed check only for the same request (a retry): replaying it for any
// other would let a client that sends one key with every request pass them all uncharged.
//
// It is the sentinel of the Redis store itself, which reports a key bound to another request
// with an error wrapping it, so that the store and the engine cannot disagree on what a
// conflict is.
var ErrIdempotencyConflict = bucket.ErrIdempotencyConflict

// idempotencyConflict is the engine's answer to a store that found a key bound to another
// request. The store's error is not kept: the caller can only act on the rule it broke.
func idempotencyConflict() error {
	return &field.Error{
		Field: "idempotency_key",
		Msg:   "already used with another request by these subjects (endpoint, cost or tier differ); use a new key per request",
		Err:   ErrIdempotencyConflict,
	}
}

// idempotency returns what binds q's idempotency record to q: the record's name, which the
// engine puts in the namespace of one of q's own subjects (recordKey), and the fingerprint the
// record holds (bucket.Request.Fingerprint). Both are the first 16 bytes of a SHA-256 over an
// unambiguous encoding (every field length-prefixed, a domain byte first) of q's subjects,
// sorted by dimension then identifier so that the order in which a client lists them does not
// change the request, followed
//   - for the name, by the idempotency key: a key is scoped to the subjects it came with, so
//     one subject's key never reaches another's record, and a key of any length or bytes makes
//     a name of 22 characters, with no escaping and nothing for a marker to collide with;
//   - for the fingerprint, by the endpoint, the cost, the tier the query asserts, if any, and
//     the entitlement it names, if any. An
//     asserted tier selects other rules and limits, so the same key under another tier is
//     another request. The tier the engine resolves from configuration is left out: it is no
//     part of what the client sent, and a configuration change during a retry must not turn
//     the retry into a conflict.
//
// The timestamp is left out (a retry may carry a new one), and so is the global subject, which
// the engine adds to every check. Dimensions are encoded by name, as in keys, so that both
// survive a renumbering of the dimensions. The fingerprint is kept raw (16 bytes): it is all
// the record holds.
//
// It costs two hashes and a few small allocations, paid only by checks with an idempotency
// key.
func idempotency(q *Query) (name, fp string) {
	subs := slices.Clone(q.Subjects)
	slices.SortFunc(subs, func(a, b Subject) int {
		return cmp.Or(strings.Compare(a.Dimension.String(), b.Dimension.String()), strings.Compare(a.ID, b.ID))
	})
	n := 1 + 6*binary.MaxVarintLen64 + len(q.IdempotencyKey) + len(q.Endpoint) + len(q.Tier) + len(q.Entitlement)
	for _, s := range subs {
		n += 2*binary.MaxVarintLen64 + len(s.Dimension.String()) + len(s.ID)
	}
	b := make([]byte, 1, n)
	b = binary.AppendUvarint(b, uint64(len(subs)))
	for _, s := range subs {
		b = appendField(b, s.Dimension.String())
		b = appendField(b, s.ID)
	}
	subjects := len(b)

	b[0] = domainName
	b = appendField(b, q.IdempotencyKey)
	sum := sha256.Sum256(b)
	name = base64.RawURLEncoding.EncodeToString(sum[:16])

	b = b[:subjects]
	b[0] = domainFingerprint
	b = appendField(b, q.Endpoint)
	b = binary.AppendVarint(b, q.Cost)
	b = appendField(b, q.Tier)
	if q.Entitlement != "" {
		// Appended only when set, so that the fingerprints of checks naming none are those of
		// the versions before entitlements: a retry across an upgrade still replays.
		b = appendField(b, q.Entitlement)
	}
	sum = sha256.Sum256(b)
	return name, string(sum[:16])
}

// Domain bytes: the name and the fingerprint hash different things, never the same bytes.
const (
	domainName        = 'n'
	domainFingerprint = 'f'
)

// appendField appends s, prefixed with its length, so that no two field lists encode alike.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
