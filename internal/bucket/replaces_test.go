package bucket

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestReplaces: a shadow request that Replaces an enforced limit (a candidate rule) is decided
// as if it had replaced it: it keeps its charge when that limit alone denied the call, and is
// refunded when any other enforced limit denied. Through Redis and through Local, the twin
// that backtests replay with.
func TestReplaces(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, c := range twins(s, time.Microsecond) {
		t.Run(c.name, func(t *testing.T) {
			live := lim(key(t, "live"), algorithm.FixedWindow, 2, long, 0)
			other := lim(key(t, "other"), algorithm.FixedWindow, 6, long, 0)
			cand := lim(key(t, "candidate"), algorithm.FixedWindow, 4, long, 0)
			call := func() []Request {
				return []Request{{Limits: []Limit{live, other}, Cost: 1}, {Limits: []Limit{cand}, Cost: 1, Shadow: true, Replaces: live.Key}}
			}
			// The live limit of 2 allows two checks; the candidate of 4 would allow four.
			for i, want := range []struct{ allowed, candidate bool }{{true, true}, {true, true}, {false, true}, {false, true}, {false, false}} {
				res := c.check(t, call())
				if res[0].Allowed != want.allowed || res[1].Allowed != want.candidate || res[1].Refunded {
					t.Errorf("check %d: allowed %v, candidate allowed %v refunded %v; want %v, %v and not refunded",
						i+1, res[0].Allowed, res[1].Allowed, res[1].Refunded, want.allowed, want.candidate)
				}
			}
			if got := c.check(t, []Request{peekReq(cand)})[0].Limits[0].Used; got != 4 {
				t.Errorf("candidate used %d, want 4: charged by the checks only its live limit denied", got)
			}
			if got := c.check(t, []Request{peekReq(other)})[0].Limits[0].Used; got != 2 {
				t.Errorf("other limit used %d, want 2: a denied check charges no enforced limit", got)
			}

			// Another enforced limit's denial refunds the candidate, as any shadow request.
			spent := lim(key(t, "spent"), algorithm.FixedWindow, 1, long, 0)
			roomy := lim(key(t, "roomy"), algorithm.FixedWindow, 10, long, 0)
			c.check(t, []Request{one(spent, 1)})
			res := c.check(t, []Request{{Limits: []Limit{roomy, spent}, Cost: 1}, {Limits: []Limit{cand2(t, roomy)}, Cost: 1, Shadow: true, Replaces: roomy.Key}})
			if res[0].Allowed || !res[1].Allowed {
				t.Fatalf("allowed %v, candidate allowed %v; want the call denied by the spent limit, the candidate allowing", res[0].Allowed, res[1].Allowed)
			}
			if got := c.check(t, []Request{peekReq(cand2(t, roomy))})[0].Limits[0].Used; got != 0 {
				t.Errorf("candidate used %d after a denial by a limit it does not replace, want 0 (refunded)", got)
			}
		})
	}
}

// cand2 is a candidate limit of the test beside live.
func cand2(t *testing.T, live Limit) Limit {
	return lim(live.Key+":candidate", algorithm.FixedWindow, 10, long, 0)
}

// TestReplacesShadowOnly: an enforced request cannot stand in for another limit.
func TestReplacesShadowOnly(t *testing.T) {
	t.Parallel()
	req := Request{Cost: 1, Replaces: "k", Limits: []Limit{lim("{x}:a", algorithm.FixedWindow, 1, time.Second, 0)}}
	if err := req.Validate(); !errors.Is(err, errReplacesShadow) {
		t.Errorf("Validate = %v, want errReplacesShadow", err)
	}
}
