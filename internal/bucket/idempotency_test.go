package bucket

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// subjectKey is key(t, name) under a hash tag of its own for sub: the keys of two subs are
// in different slots of a cluster (unless they happen to hash alike), as a check's subjects
// are.
func subjectKey(t testing.TB, sub, name string) string {
	k := key(t, name)
	i := strings.IndexByte(k, '}')
	return k[:i] + "-" + sub + k[i:]
}

// idemCall is one checked request as the engine sends it: requests of several subjects, the
// first carrying the record. Every limit allows 5 units for a long window; each call costs 2.
type idemCall struct {
	name string
	reqs func(t *testing.T) []Request
}

func idemCalls() []idemCall {
	tb := func(t *testing.T, sub string) Limit {
		return lim(subjectKey(t, sub, "tb"), algorithm.TokenBucket, 5, long, 0)
	}
	fw := func(t *testing.T, sub string) Limit {
		return lim(subjectKey(t, sub, "fw"), algorithm.FixedWindow, 5, long, 0)
	}
	rec := func(t *testing.T, r Request) Request {
		r.IdempotencyKey, r.Fingerprint = subjectKey(t, "a", "idem"), "fp-1"
		return r
	}
	return []idemCall{
		{"one limit", func(t *testing.T) []Request {
			return []Request{rec(t, Request{Limits: []Limit{tb(t, "a")}, Cost: 2})}
		}},
		{"two limits", func(t *testing.T) []Request {
			return []Request{rec(t, Request{Limits: []Limit{tb(t, "a"), fw(t, "a")}, Cost: 2})}
		}},
		// The record's request is the only one that can deny: its script writes the record.
		{"with a shadow request", func(t *testing.T) []Request {
			return []Request{rec(t, Request{Limits: []Limit{tb(t, "a")}, Cost: 2}), {Limits: []Limit{fw(t, "b")}, Cost: 2, Shadow: true}}
		}},
		// Others can deny: Store writes the record once every reply is in.
		{"three subjects", func(t *testing.T) []Request {
			return []Request{
				rec(t, Request{Limits: []Limit{tb(t, "a")}, Cost: 2}),
				{Limits: []Limit{fw(t, "b"), tb(t, "b")}, Cost: 2},
				{Limits: []Limit{lim(subjectKey(t, "c", "g"), algorithm.GCRA, 5, long, 0)}, Cost: 2},
			}
		}},
		{"record on a shadow request", func(t *testing.T) []Request {
			return []Request{rec(t, Request{Limits: []Limit{fw(t, "a")}, Cost: 2, Shadow: true}), {Limits: []Limit{tb(t, "b")}, Cost: 2}}
		}},
	}
}

// remainingAll peeks at what every limit of reqs has left.
func remainingAll(t *testing.T, s *Store, reqs []Request) []int64 {
	t.Helper()
	var rem []int64
	for _, r := range reqs {
		for _, l := range r.Limits {
			rem = append(rem, check(t, s, peekReq(l)).Limits[0].Remaining)
		}
	}
	return rem
}

func wantRemaining(t *testing.T, what string, got []int64, want int64) {
	t.Helper()
	for i, rem := range got {
		if rem != want {
			t.Errorf("%s: limit %d has %d remaining, want %d", what, i, rem, want)
		}
	}
}

// TestStoreIdempotencyReplay: a call's one record replays it, on one server and across the
// slots of a cluster: nothing is charged again (the other requests' charges are refunded),
// the answer is the first decision (allowed) and the counters are today's. The record holds
// the fingerprint alone, for IdempotencyTTL.
func TestStoreIdempotencyReplay(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	for _, tc := range idemCalls() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			reqs := tc.reqs(t)
			first, err := s.Check(ctx, reqs)
			if err != nil {
				t.Fatalf("first Check: %v", err)
			}
			for i, r := range first {
				if !r.Allowed || r.Replayed || r.Refunded {
					t.Fatalf("first, request %d: allowed %v replayed %v refunded %v, want allowed only", i, r.Allowed, r.Replayed, r.Refunded)
				}
			}
			rec := reqs[0].IdempotencyKey
			if got, err := c.Get(ctx, rec).Result(); err != nil || got != reqs[0].Fingerprint {
				t.Errorf("record %q holds %q (%v), want the fingerprint %q", rec, got, err, reqs[0].Fingerprint)
			}
			if ttl := c.PTTL(ctx, rec).Val(); ttl <= IdempotencyTTL-time.Minute || ttl > IdempotencyTTL {
				t.Errorf("record TTL %v, want about %v", ttl, IdempotencyTTL)
			}

			for try := range 2 {
				again, err := s.Check(ctx, reqs)
				if err != nil {
					t.Fatalf("retry %d: %v", try, err)
				}
				for i, r := range again {
					checkInvariants(t, reqs[i], r)
					switch {
					case !r.Replayed:
						t.Errorf("retry %d, request %d: replayed false, want true", try, i)
					case !reqs[i].Shadow && !r.Allowed:
						t.Errorf("retry %d, request %d: denied, want the first decision (allowed)", try, i)
					}
					for k, lr := range r.Limits {
						if lr.Remaining != first[i].Limits[k].Remaining {
							t.Errorf("retry %d, request %d limit %d: remaining %d, want %d (the state now)", try, i, k, lr.Remaining, first[i].Limits[k].Remaining)
						}
					}
				}
			}
			wantRemaining(t, "after the retries", remainingAll(t, s, reqs), 3)
		})
	}
}

// TestStoreIdempotencyReplayWhenFull: a retry replays the first decision even when a limit has
// filled up since; it charges nothing.
func TestStoreIdempotencyReplayWhenFull(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	a := lim(subjectKey(t, "a", "tb"), algorithm.TokenBucket, 5, long, 0)
	b := lim(subjectKey(t, "b", "fw"), algorithm.FixedWindow, 5, long, 0)
	reqs := []Request{{Limits: []Limit{a}, Cost: 2, IdempotencyKey: subjectKey(t, "a", "idem"), Fingerprint: "fp"}, one(b, 2)}
	if _, err := s.Check(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if r := check(t, s, one(b, 3)); !r.Allowed {
		t.Fatal("filling b: denied")
	}
	res, err := s.Check(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Allowed || !r.Replayed {
			t.Errorf("request %d: allowed %v replayed %v, want the first decision replayed", i, r.Allowed, r.Replayed)
		}
	}
	if got := res[1].Limits[0].Remaining; got != 0 {
		t.Errorf("b in the replay: remaining %d, want 0 (the state now)", got)
	}
	if got := remainingAll(t, s, reqs); got[0] != 3 || got[1] != 0 {
		t.Errorf("after the replay: remaining %v, want [3 0] (nothing charged)", got)
	}
}

// TestStoreIdempotencyConflict: a record refuses another fingerprint with
// ErrIdempotencyConflict, charging nothing (the other requests' charges are refunded) and
// keeping the record, which still replays for its own fingerprint.
func TestStoreIdempotencyConflict(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	for _, tc := range idemCalls() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			reqs := tc.reqs(t)
			if _, err := s.Check(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			rec := reqs[0].IdempotencyKey
			for _, fp := range []string{"fp-2", ""} {
				other := append([]Request(nil), reqs...)
				other[0].Fingerprint = fp
				_, err := s.Check(ctx, other)
				if !errors.Is(err, ErrIdempotencyConflict) {
					t.Errorf("fingerprint %q: error %v, want ErrIdempotencyConflict", fp, err)
				}
				// The guard of package checker tells outages from script errors by the Redis
				// error in the chain: a conflict must never look like an outage.
				if rerr := redis.Error(nil); !errors.As(err, &rerr) {
					t.Errorf("fingerprint %q: error %v does not wrap the script's Redis error", fp, err)
				}
			}
			wantRemaining(t, "after the conflicts", remainingAll(t, s, reqs), 3)
			if got := c.Get(ctx, rec).Val(); got != reqs[0].Fingerprint {
				t.Errorf("a conflict changed the record to %q", got)
			}
			res, err := s.Check(ctx, reqs)
			if err != nil || !res[0].Replayed {
				t.Errorf("first fingerprint after the conflicts: %+v, %v; want replayed", res, err)
			}
		})
	}
}

// TestStoreIdempotencyDenied: a denied call leaves no record, whether its record's request or
// another denied it: nothing of it stayed charged, so a retry is decided afresh (and the key
// is free for another request).
func TestStoreIdempotencyDenied(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	tests := []struct {
		name     string
		deniedBy int
	}{{"by the record's request", 0}, {"by another request", 1}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			a := lim(subjectKey(t, "a", "tb"), algorithm.TokenBucket, 5, long, 0)
			b := lim(subjectKey(t, "b", "gcra"), algorithm.GCRA, 5, long, 0)
			full := []Limit{a, b}[tt.deniedBy]
			if r := check(t, s, one(full, 4)); !r.Allowed {
				t.Fatal("filling: denied")
			}
			reqs := []Request{{Limits: []Limit{a}, Cost: 2, IdempotencyKey: subjectKey(t, "a", "idem"), Fingerprint: "fp-1"}, one(b, 2)}
			for try := range 2 {
				res, err := s.Check(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				if res[tt.deniedBy].Allowed || res[0].Replayed || res[1].Replayed {
					t.Errorf("try %d: %+v, want denied by request %d, not replayed", try, res, tt.deniedBy)
				}
				if n := c.Exists(ctx, reqs[0].IdempotencyKey).Val(); n != 0 {
					t.Errorf("try %d: a denied call left its idempotency record", try)
				}
			}
			if got := remainingAll(t, s, reqs); got[tt.deniedBy] != 1 || got[1-tt.deniedBy] != 5 {
				t.Errorf("remaining %v, want 1 on the full limit and 5 on the other (nothing charged)", got)
			}
			other := append([]Request(nil), reqs...)
			other[0].Fingerprint = "fp-2"
			if _, err := s.Check(ctx, other); err != nil {
				t.Errorf("another request with the key of a denied one: %v, want it decided", err)
			}
		})
	}
}

// TestStoreIdempotencyOneRecordPerCall: a call is one checked request and has one record;
// two are refused before anything is sent.
func TestStoreIdempotencyOneRecordPerCall(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	a := Request{Limits: []Limit{lim(subjectKey(t, "a", "tb"), algorithm.TokenBucket, 5, long, 0)}, Cost: 1, IdempotencyKey: subjectKey(t, "a", "idem")}
	b := Request{Limits: []Limit{lim(subjectKey(t, "b", "tb"), algorithm.TokenBucket, 5, long, 0)}, Cost: 1, IdempotencyKey: subjectKey(t, "b", "idem")}
	_, err := s.Check(ctx, []Request{a, b})
	if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "more than one request carries an idempotency key") {
		t.Errorf("two records: %v, want ErrInvalidRequest saying so", err)
	}
	for _, k := range []string{a.Limits[0].Key, a.IdempotencyKey, b.Limits[0].Key, b.IdempotencyKey} {
		if n := c.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s exists: a refused call wrote it", k)
		}
	}
	// A peek's key is ignored, so it does not count.
	a.Peek = true
	if _, err := s.Check(ctx, []Request{a, b}); err != nil {
		t.Errorf("a peek with a key beside a record: %v", err)
	}
}
