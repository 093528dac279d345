package bucket

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestStoreAllOrNothing: one subject with [10/hour fresh, 1/hour used] is denied and the first
// limit is not charged, whatever its algorithm.
func TestStoreAllOrNothing(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			free := lim(key(t, "free"), a, 10, time.Hour, 0)
			used := lim(key(t, "used"), algorithm.FixedWindow, 1, long, 0)
			if res := check(t, s, one(used, 1)); !res.Allowed {
				t.Fatalf("using up the 1/hour limit: denied")
			}
			req := Request{Limits: []Limit{free, used}, Cost: 1}
			res := check(t, s, req)
			checkInvariants(t, req, res)
			if res.Allowed || !res.Limits[0].Allowed || res.Limits[1].Allowed {
				t.Fatalf("got allowed %v, limits %v %v, want false, true false", res.Allowed, res.Limits[0].Allowed, res.Limits[1].Allowed)
			}
			if got := res.Limits[0].Remaining; got != 10 {
				t.Errorf("denied check reports remaining %d on the free limit, want 10 (uncharged)", got)
			}
			if got := check(t, s, peekReq(free)).Limits[0].Remaining; got != 10 {
				t.Errorf("free limit after the denied check: remaining %d, want 10", got)
			}
		})
	}
}

// TestStoreLocalAllOrNothing is the same for Local.
func TestLocalAllOrNothing(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			loc := NewLocal(0)
			free := lim("free", a, 10, time.Hour, 0)
			used := lim("used", algorithm.FixedWindow, 1, long, 0)
			loc.Check(now, one(used, 1))
			if res := loc.Check(now, Request{Limits: []Limit{free, used}, Cost: 1}); res.Allowed {
				t.Fatalf("allowed with a used-up limit")
			}
			if got := loc.Check(now, peekReq(free)).Limits[0].Remaining; got != 10 {
				t.Errorf("free limit after the denied check: remaining %d, want 10", got)
			}
		})
	}
}

// TestStoreCrossSubjectRefund: in one Check, subject A is allowed and subject B denied, so A's
// charge is given back and A reads as before.
func TestStoreCrossSubjectRefund(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			la := lim(key(t, "a"), a, 5, long, 0)
			lb := lim(key(t, "b"), algorithm.GCRA, 1, long, 0)
			if res := check(t, s, one(la, 2)); !res.Allowed {
				t.Fatalf("charging A: denied")
			}
			check(t, s, one(lb, 1))
			before := check(t, s, peekReq(la)).Limits[0]
			var card int64
			if a == algorithm.SlidingWindowLog {
				card = c.ZCard(ctx, la.Key).Val()
			}

			idem := key(t, "idem")
			reqs := []Request{{Limits: []Limit{la}, Cost: 2, IdempotencyKey: idem}, one(lb, 1)}
			res, err := s.Check(ctx, reqs)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if res[1].Allowed || res[1].Refunded {
				t.Errorf("B: got allowed %v refunded %v, want false false", res[1].Allowed, res[1].Refunded)
			}
			if !res[0].Refunded {
				t.Errorf("A: refunded false, want true")
			}
			checkInvariants(t, reqs[0], res[0])
			if got := res[0].Limits[0]; got.Remaining != before.Remaining || got.Used != before.Used {
				t.Errorf("A's refunded result: used %d remaining %d, want %d %d", got.Used, got.Remaining, before.Used, before.Remaining)
			}
			after := check(t, s, peekReq(la)).Limits[0]
			if after.Remaining != before.Remaining || after.Used != before.Used {
				t.Errorf("A after the refund: used %d remaining %d, want %d %d", after.Used, after.Remaining, before.Used, before.Remaining)
			}
			if a == algorithm.SlidingWindowLog {
				if got := c.ZCard(ctx, la.Key).Val(); got != card {
					t.Errorf("log entries after the refund: %d, want %d", got, card)
				}
			}
			if n := c.Exists(ctx, idem).Val(); n != 0 {
				t.Errorf("idempotency record of the refunded charge still exists")
			}
		})
	}
}

// TestStoreCheckAllAllowed: several subjects all allowed in one pipelined Check are all charged.
func TestStoreCheckAllAllowed(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	var reqs []Request
	for _, a := range allAlgorithms {
		reqs = append(reqs, one(lim(key(t, a.Code()), a, 5, long, 0), 2))
	}
	reqs = append(reqs, Request{Limits: []Limit{lim(key(t, "peeked"), algorithm.GCRA, 5, long, 0)}, Cost: 2, Peek: true})
	res, err := s.Check(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	for i, r := range res {
		checkInvariants(t, reqs[i], r)
		want := int64(3)
		if reqs[i].Peek {
			want = 5
		}
		if !r.Allowed || r.Refunded || r.Limits[0].Remaining != want {
			t.Errorf("request %d: got allowed %v refunded %v remaining %d, want true false %d", i, r.Allowed, r.Refunded, r.Limits[0].Remaining, want)
		}
	}
}

func TestStorePeek(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), a, 3, long, 0)
			for i := 0; i < 5; i++ {
				res := check(t, s, Request{Limits: []Limit{l}, Cost: 3, Peek: true, IdempotencyKey: key(t, "idem")})
				if !res.Allowed || res.Limits[0].Remaining != 3 || res.Replayed {
					t.Fatalf("peek %d: got allowed %v remaining %d replayed %v, want true 3 false", i, res.Allowed, res.Limits[0].Remaining, res.Replayed)
				}
			}
			if n := c.Exists(ctxT(t), l.Key, key(t, "idem")).Val(); n != 0 {
				t.Errorf("peeks wrote %d keys, want 0", n)
			}
			if res := check(t, s, one(l, 3)); !res.Allowed {
				t.Errorf("charge after peeks denied")
			}
		})
	}
}

// TestStoreCapacityChange: raising or lowering a token bucket's burst keeps what was consumed.
func TestStoreCapacityChange(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	loc := NewLocal(0)
	now := time.Now()
	tests := []struct {
		name     string
		newBurst int64
		want     int64
	}{
		{"raised", 200, 110},
		{"lowered", 50, 0},
		{"unchanged", 100, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), algorithm.TokenBucket, 100, long, 100)
			check(t, s, one(l, 90))
			loc.Check(now, one(l, 90))
			l.Burst = tt.newBurst
			if got := check(t, s, peekReq(l)).Limits[0].Remaining; got != tt.want {
				t.Errorf("store: remaining %d, want %d", got, tt.want)
			}
			if got := loc.Check(now, peekReq(l)).Limits[0].Remaining; got != tt.want {
				t.Errorf("local: remaining %d, want %d", got, tt.want)
			}
		})
	}
}

func TestStoreValidation(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	good := lim("k", algorithm.GCRA, 1, time.Second, 0)
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"zero cost", Request{Limits: []Limit{good}}, "cost"},
		{"negative cost", Request{Limits: []Limit{good}, Cost: -1}, "cost"},
		{"no limits", Request{Cost: 1}, "no limits"},
		{"empty key", one(Limit{Algorithm: algorithm.GCRA, Limit: 1, Window: time.Second}, 1), "empty key"},
		{"bad algorithm", one(Limit{Key: "k", Algorithm: algorithm.Balance + 1, Limit: 1, Window: time.Second}, 1), "algorithm"},
		{"balance without periods", one(Limit{Key: "k", Algorithm: algorithm.Balance, Limit: 1, Window: time.Second}, 1), "calendar periods"},
		{"zero algorithm", one(Limit{Key: "k", Limit: 1, Window: time.Second}, 1), "algorithm"},
		{"zero limit", one(Limit{Key: "k", Algorithm: algorithm.GCRA, Window: time.Second}, 1), "limit must"},
		{"sub-µs window", one(Limit{Key: "k", Algorithm: algorithm.GCRA, Limit: 1, Window: time.Nanosecond}, 1), "window"},
		{"negative burst", one(Limit{Key: "k", Algorithm: algorithm.GCRA, Limit: 1, Window: time.Second, Burst: -1}, 1), "burst"},
		{"huge limit", one(Limit{Key: "k", Algorithm: algorithm.GCRA, Limit: 1 << 60, Window: time.Second}, 1), "limit must"},
		{"same key twice", Request{Limits: []Limit{good, good}, Cost: 1}, "same key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.Check(ctxT(t), []Request{one(good, 1), tt.req})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "request 1") {
				t.Errorf("got error %v, want one naming request 1 and %q", err, tt.want)
			}
			res := NewLocal(0).Check(time.Now(), tt.req)
			if res.Allowed {
				t.Errorf("local: invalid request allowed")
			}
			for i, lr := range res.Limits {
				if lr.RetryAfter <= 0 {
					t.Errorf("local: limit %d denied with retry after %v", i, lr.RetryAfter)
				}
			}
		})
	}
	if res, err := s.Check(ctxT(t), nil); res != nil || err != nil {
		t.Errorf("no requests: got %v, %v, want nil, nil", res, err)
	}
	if err := (&Request{Cost: 1}).Validate(); !errors.Is(err, errNoLimits) {
		t.Errorf("Validate: got %v, want errNoLimits", err)
	}
}

// TestStoreShadow: a shadow request that denies neither denies the call nor refunds the
// enforced requests; an enforced denial refunds the shadow request's charge too.
func TestStoreShadow(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	enforced := lim(key(t, "enforced"), algorithm.FixedWindow, 5, long, 0)
	shadow := lim(key(t, "shadow"), algorithm.FixedWindow, 1, long, 0)
	check(t, s, one(shadow, 1)) // the shadow limit is now spent
	reqs := []Request{one(enforced, 1), {Limits: []Limit{shadow}, Cost: 1, Shadow: true}}
	res, err := s.Check(ctxT(t), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Allowed || res[0].Refunded || res[1].Allowed {
		t.Fatalf("enforced allowed %v refunded %v, shadow allowed %v; want the enforced charge kept and the shadow denial reported",
			res[0].Allowed, res[0].Refunded, res[1].Allowed)
	}
	if got := check(t, s, peekReq(enforced)).Limits[0].Remaining; got != 4 {
		t.Errorf("enforced remaining = %d, want 4: a shadow denial must not refund", got)
	}

	spent := lim(key(t, "spent"), algorithm.FixedWindow, 1, long, 0)
	open := lim(key(t, "open"), algorithm.FixedWindow, 5, long, 0)
	check(t, s, one(spent, 1))
	res, err = s.Check(ctxT(t), []Request{one(spent, 1), {Limits: []Limit{open}, Cost: 1, Shadow: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Allowed || !res[1].Refunded {
		t.Errorf("enforced allowed %v, shadow refunded %v; want the denial to refund the shadow charge", res[0].Allowed, res[1].Refunded)
	}
	if got := check(t, s, peekReq(open)).Limits[0].Remaining; got != 5 {
		t.Errorf("shadow remaining = %d, want 5 after the refund", got)
	}
}
