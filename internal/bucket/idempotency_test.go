package bucket

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// idemLimits returns the limits of a request with n limits (the script has a path for one and
// one for several), each allowing 5 units for a long window.
func idemLimits(t *testing.T, n int) []Limit {
	ls := []Limit{lim(key(t, "tb"), TokenBucket, 5, long, 0), lim(key(t, "fw"), FixedWindow, 5, long, 0)}
	return ls[:n]
}

// remaining peeks at what each of ls has left.
func remaining(t *testing.T, s *Store, ls []Limit) []int64 {
	t.Helper()
	res := check(t, s, Request{Limits: ls, Cost: 1, Peek: true})
	rem := make([]int64, len(ls))
	for i, lr := range res.Limits {
		rem[i] = lr.Remaining
	}
	return rem
}

// TestStoreIdempotencyFingerprint: a record replays for the fingerprint that wrote it and
// refuses any other with ErrIdempotencyConflict, charging nothing and keeping the record.
func TestStoreIdempotencyFingerprint(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	for _, n := range []int{1, 2} {
		t.Run(map[int]string{1: "one limit", 2: "two limits"}[n], func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			req := Request{Limits: idemLimits(t, n), Cost: 2, IdempotencyKey: key(t, "idem"), Fingerprint: "fp-1"}
			first := check(t, s, req)
			if !first.Allowed || first.Replayed {
				t.Fatalf("first: allowed %v replayed %v, want allowed, not replayed", first.Allowed, first.Replayed)
			}
			record := c.Get(ctx, req.IdempotencyKey).Val()

			again := check(t, s, req)
			if !again.Replayed {
				t.Errorf("same fingerprint: replayed false, want true")
			}
			again.Replayed = false
			if !reflect.DeepEqual(first, again) {
				t.Errorf("replayed result differs:\n got %+v\nwant %+v", again, first)
			}

			for _, fp := range []string{"fp-2", ""} {
				other := req
				other.Fingerprint = fp
				_, err := s.Check(ctx, []Request{other})
				if !errors.Is(err, ErrIdempotencyConflict) {
					t.Errorf("fingerprint %q: error %v, want ErrIdempotencyConflict", fp, err)
				}
				// The guard of package checker tells outages from script errors by the Redis
				// error in the chain: a conflict must never look like an outage.
				if rerr := redis.Error(nil); !errors.As(err, &rerr) {
					t.Errorf("fingerprint %q: error %v does not wrap the script's Redis error", fp, err)
				}
			}
			for i, rem := range remaining(t, s, req.Limits) {
				if rem != 3 {
					t.Errorf("limit %d after the conflicts: remaining %d, want 3 (charged once)", i, rem)
				}
			}
			if got := c.Get(ctx, req.IdempotencyKey).Val(); got != record {
				t.Errorf("a conflict changed the idempotency record")
			}
			if res := check(t, s, req); !res.Replayed {
				t.Errorf("first fingerprint after the conflicts: replayed false, want true")
			}
		})
	}
}

// TestStoreIdempotencyConflictRefundsOthers: when one request of a call conflicts, the others'
// charges are given back (and their new records deleted), as after a denial.
func TestStoreIdempotencyConflictRefundsOthers(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	a := Request{Limits: []Limit{lim(key(t, "a"), GCRA, 5, long, 0)}, Cost: 1, IdempotencyKey: key(t, "idem-a"), Fingerprint: "fp-2"}
	b := Request{Limits: []Limit{lim(key(t, "b"), TokenBucket, 5, long, 0)}, Cost: 1, IdempotencyKey: key(t, "idem-b"), Fingerprint: "fp-1"}
	check(t, s, b)

	b.Fingerprint = "fp-2"
	if _, err := s.Check(ctx, []Request{a, b}); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("Check: error %v, want ErrIdempotencyConflict", err)
	}
	if got := remaining(t, s, a.Limits)[0]; got != 5 {
		t.Errorf("A after the conflict of B: remaining %d, want 5 (refunded)", got)
	}
	if got := remaining(t, s, b.Limits)[0]; got != 4 {
		t.Errorf("B after its conflict: remaining %d, want 4 (its first charge only)", got)
	}
	if n := c.Exists(ctx, a.IdempotencyKey).Val(); n != 0 {
		t.Errorf("A's idempotency record outlived the refund of its charge")
	}
}

// TestStoreIdempotencyLegacyRecord: a record of the script's previous version holds no
// fingerprint. It is bound to the empty fingerprint: replayed for a request without one, a
// conflict for any other (never replayed unverified, never charged a second time).
func TestStoreIdempotencyLegacyRecord(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	tests := []struct {
		name        string
		limits      int
		fingerprint string
		wantReplay  bool
	}{
		{"one limit, no fingerprint", 1, "", true},
		{"one limit, fingerprint", 1, "fp-1", false},
		{"two limits, no fingerprint", 2, "", true},
		{"two limits, fingerprint", 2, "fp-1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			req := Request{Limits: idemLimits(t, tt.limits), Cost: 2, IdempotencyKey: key(t, "idem")}
			first := check(t, s, req)
			// Rewrite the record as the previous version wrote it: the packed reply alone.
			legacy := `return redis.call('SET', KEYS[1], cmsgpack.pack((cmsgpack.unpack(redis.call('GET', KEYS[1])))), 'KEEPTTL')`
			if err := c.Eval(ctx, legacy, []string{req.IdempotencyKey}).Err(); err != nil {
				t.Fatalf("writing a legacy record: %v", err)
			}
			if ttl := c.PTTL(ctx, req.IdempotencyKey).Val(); ttl <= IdempotencyTTL-time.Minute {
				t.Fatalf("legacy record TTL %v, want about %v", ttl, IdempotencyTTL)
			}

			req.Fingerprint = tt.fingerprint
			res, err := s.Check(ctx, []Request{req})
			switch {
			case tt.wantReplay && err != nil:
				t.Fatalf("Check: %v", err)
			case tt.wantReplay && (!res[0].Replayed || res[0].Limits[0].Remaining != first.Limits[0].Remaining):
				t.Errorf("got replayed %v remaining %d, want the first result (remaining %d) replayed",
					res[0].Replayed, res[0].Limits[0].Remaining, first.Limits[0].Remaining)
			case !tt.wantReplay && !errors.Is(err, ErrIdempotencyConflict):
				t.Errorf("got %+v, %v, want ErrIdempotencyConflict", res, err)
			}
			for i, rem := range remaining(t, s, req.Limits) {
				if rem != 3 {
					t.Errorf("limit %d: remaining %d, want 3 (charged once)", i, rem)
				}
			}
		})
	}
}
