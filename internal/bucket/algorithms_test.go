package bucket

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// step is one check of an algorithm case and what it must return for its only limit.
type step struct {
	cost      int64
	peek      bool
	allowed   bool
	used      int64
	remaining int64
}

// algCase is a sequence of checks on a fresh key with a long window, so that Redis (real
// time) and Local (fixed time) must give the same numbers.
type algCase struct {
	name  string
	alg   algorithm.ID
	limit int64
	burst int64
	steps []step
}

func algCases() []algCase {
	var cs []algCase
	for _, a := range allAlgorithms {
		cs = append(cs,
			algCase{name: a.String() + "/unit_cost", alg: a, limit: 5, steps: []step{
				{cost: 1, allowed: true, used: 1, remaining: 4},
				{cost: 1, allowed: true, used: 2, remaining: 3},
				{cost: 1, allowed: true, used: 3, remaining: 2},
				{cost: 1, allowed: true, used: 4, remaining: 1},
				{cost: 1, allowed: true, used: 5, remaining: 0},
				{cost: 1, allowed: false, used: 5, remaining: 0},
				{cost: 1, peek: true, allowed: false, used: 5, remaining: 0},
			}},
			algCase{name: a.String() + "/cost_2", alg: a, limit: 5, steps: []step{
				{cost: 2, peek: true, allowed: true, used: 0, remaining: 5},
				{cost: 2, allowed: true, used: 2, remaining: 3},
				{cost: 2, allowed: true, used: 4, remaining: 1},
				{cost: 2, allowed: false, used: 4, remaining: 1},
				{cost: 1, allowed: true, used: 5, remaining: 0},
			}},
			algCase{name: a.String() + "/over_capacity", alg: a, limit: 5, steps: []step{
				{cost: 6, allowed: false, used: 0, remaining: 5},
				{cost: 5, allowed: true, used: 5, remaining: 0},
			}},
		)
		if a.HasBurst() {
			cs = append(cs, algCase{name: a.String() + "/burst", alg: a, limit: 5, burst: 10, steps: []step{
				{cost: 8, allowed: true, used: 8, remaining: 2},
				{cost: 2, allowed: true, used: 10, remaining: 0},
				{cost: 1, allowed: false, used: 10, remaining: 0},
			}})
		} else {
			cs = append(cs, algCase{name: a.String() + "/burst_ignored", alg: a, limit: 5, burst: 10, steps: []step{
				{cost: 5, allowed: true, used: 5, remaining: 0},
				{cost: 1, allowed: false, used: 5, remaining: 0},
			}})
		}
	}
	return cs
}

// runAlgCase plays c through checkFn and compares every step.
func runAlgCase(t *testing.T, c algCase, k string, checkFn func(Request) Result) {
	l := lim(k, c.alg, c.limit, long, c.burst)
	for i, st := range c.steps {
		req := Request{Limits: []Limit{l}, Cost: st.cost, Peek: st.peek}
		res := checkFn(req)
		checkInvariants(t, req, res)
		lr := res.Limits[0]
		if res.Allowed != st.allowed || lr.Used != st.used || lr.Remaining != st.remaining {
			t.Errorf("step %d (cost %d, peek %v): got allowed %v used %d remaining %d, want %v %d %d",
				i, st.cost, st.peek, res.Allowed, lr.Used, lr.Remaining, st.allowed, st.used, st.remaining)
		}
		if !res.Allowed && st.cost > l.Capacity() && lr.RetryAfter < l.Window {
			t.Errorf("step %d: cost over capacity retries after %v, want at least the window %v", i, lr.RetryAfter, l.Window)
		}
	}
}

func TestStoreAlgorithms(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, c := range algCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runAlgCase(t, c, key(t, "b"), func(req Request) Result { return check(t, s, req) })
		})
	}
}

func TestLocalAlgorithms(t *testing.T) {
	t.Parallel()
	l := NewLocal(0)
	now := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, c := range algCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			at := now
			runAlgCase(t, c, key(t, "b"), func(req Request) Result {
				at = at.Add(7 * time.Microsecond) // like Redis, time moves a little between checks
				return l.Check(at, req)
			})
		})
	}
}

// TestGCRAExactFit is the case that needs the float slack: 3 per second are exactly 3 periods
// of 1/3 s, which must all fit.
func TestGCRAExactFit(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	local := NewLocal(0)
	now := time.Now()
	for _, a := range []algorithm.ID{algorithm.GCRA, algorithm.TokenBucket, algorithm.LeakyBucket, algorithm.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			lr := lim(key(t, "b"), a, 3, time.Hour, 0)
			res := check(t, s, one(lr, 3))
			if !res.Allowed || res.Limits[0].Remaining != 0 {
				t.Errorf("store: cost 3 of 3: got allowed %v remaining %d, want true 0", res.Allowed, res.Limits[0].Remaining)
			}
			ll := lim(key(t, "local"), a, 3, time.Second, 0)
			for i := 0; i < 3; i++ {
				if res := local.Check(now, one(ll, 1)); !res.Allowed {
					t.Errorf("local: check %d of 3 at one instant denied", i+1)
				}
			}
			if res := local.Check(now, one(ll, 1)); res.Allowed {
				t.Errorf("local: 4th check of 3 allowed")
			}
		})
	}
}
