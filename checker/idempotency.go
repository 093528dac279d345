package checker

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
)

// ErrIdempotencyConflict is wrapped by the error of a check whose idempotency key was already
// used, within its 5 minutes, for another request: other subjects, endpoint, cost or asserted
// tier. The error is also a *FieldError on "idempotency_key", so transports answer it as a
// broken request (InvalidArgument; HTTP 409 where a conflict has a status of its own).
//
// A key replays the first decision only for the same request (a retry): replaying it for any
// other would let a client that sends one key with every request pass them all uncharged.
var ErrIdempotencyConflict = errors.New("idempotency key already used with another request")

// idempotencyConflict is the engine's answer to a store that found a key bound to another
// request. The store's error is not kept: the caller can only act on the rule it broke.
func idempotencyConflict() error {
	return &FieldError{
		Field: "idempotency_key",
		Msg:   "already used with another request (subjects, endpoint, cost or tier differ); use a new key per request",
		Err:   ErrIdempotencyConflict,
	}
}

// fingerprint identifies what q asks, for binding its idempotency records to it
// (bucket.Request.Fingerprint): the first 16 bytes of a SHA-256, in hex, over an unambiguous
// encoding (every field length-prefixed) of
//   - the subjects, sorted by dimension then identifier: the order in which a client lists
//     them does not change the request;
//   - the endpoint and the cost;
//   - the tier the query asserts, if any. An asserted tier selects other rules and limits, so
//     the same key under another tier is another request. The tier the engine resolves from
//     configuration is left out: it is no part of what the client sent, and a configuration
//     change during a retry must not turn the retry into a conflict.
//
// The timestamp is left out (a retry may carry a new one), and so is the global subject, which
// the engine adds to every check. Dimensions are encoded by name, as in keys, so that the
// fingerprint of a request survives a renumbering of the dimensions.
//
// It costs a hash and a few small allocations, paid only by checks with an idempotency key.
func fingerprint(q *Query) string {
	subs := slices.Clone(q.Subjects)
	slices.SortFunc(subs, func(a, b Subject) int {
		return cmp.Or(strings.Compare(a.Dimension.String(), b.Dimension.String()), strings.Compare(a.ID, b.ID))
	})
	n := 4*binary.MaxVarintLen64 + len(q.Endpoint) + len(q.Tier)
	for _, s := range subs {
		n += 2*binary.MaxVarintLen64 + len(s.Dimension.String()) + len(s.ID)
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(subs)))
	for _, s := range subs {
		b = appendField(b, s.Dimension.String())
		b = appendField(b, s.ID)
	}
	b = appendField(b, q.Endpoint)
	b = binary.AppendVarint(b, q.Cost)
	b = appendField(b, q.Tier)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// appendField appends s, prefixed with its length, so that no two field lists encode alike.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
