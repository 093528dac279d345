package bucket

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// TestStoreSlidingLogCost: a charge of any cost is one entry of the window, so that a check of
// cost 1e6 costs Redis what a check of cost 1 does (today's script wrote a member per unit:
// 2.3 s and 120 MiB for this one), and the window stays exact around it.
func TestStoreSlidingLogCost(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	const L = 1_000_000
	l := lim(key(t, "b"), algorithm.SlidingWindowLog, L, time.Hour, 0)
	res := check(t, s, one(l, L-1))
	if !res.Allowed || res.Limits[0].Remaining != 1 {
		t.Fatalf("cost %d of %d: got allowed %v remaining %d, want true 1", L-1, L, res.Allowed, res.Limits[0].Remaining)
	}
	if res = check(t, s, one(l, 1)); !res.Allowed || res.Limits[0].Remaining != 0 {
		t.Fatalf("the last unit: got allowed %v remaining %d, want true 0", res.Allowed, res.Limits[0].Remaining)
	}
	if res = check(t, s, one(l, 1)); res.Allowed {
		t.Fatalf("a unit past the limit was allowed")
	}
	if n := serverOf(t, c, l.Key).ZCard(ctx, l.Key).Val(); n != 2 {
		t.Errorf("the window holds %d entries after two charges, want 2", n)
	}
	if b := serverOf(t, c, l.Key).MemoryUsage(ctx, l.Key).Val(); b > 1024 {
		t.Errorf("the window takes %d bytes of Redis memory, want at most 1 KiB", b)
	}
}

// refundNow gives back the charge that res (the result of req, allowed) made, as Check does
// after another request of its call denied, but at a time of the test's choosing: other
// charges may have landed on the key since.
func refundNow(t *testing.T, s *Store, req Request, res Result) Result {
	t.Helper()
	results := []Result{res}
	j := refundJob(s.getJob(), []Request{req}, results, []int{0}, -1)
	if err := s.refund(ctxT(t), j, results, []int{0}); err != nil {
		t.Fatalf("refund: %v", err)
	}
	return results[0]
}

// TestStoreSlidingLogRefund: a refund takes its charge out of the window exactly, also when
// charges landed after it (whose entries it renumbers) and when another refund renumbered its
// own entry meanwhile; the units left expire in order, as the retry times show.
func TestStoreSlidingLogRefund(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	const L = 10
	l := lim(key(t, "b"), algorithm.SlidingWindowLog, L, time.Hour, 0)
	charge := func(cost int64) (Request, Result) {
		req := one(l, cost)
		res := check(t, s, req)
		if !res.Allowed {
			t.Fatalf("charge of %d denied: %+v", cost, res.Limits[0])
		}
		return req, res
	}
	remaining := func() int64 { return check(t, s, peekReq(l)).Limits[0].Remaining }

	_, a := charge(2)
	x1req, x1 := charge(3)
	x2req, x2 := charge(1)
	_, b := charge(4)
	if got := remaining(); got != 0 {
		t.Fatalf("after charges of 2, 3, 1, 4: remaining %d, want 0", got)
	}
	refundNow(t, s, x1req, x1) // renumbers x2 and b
	if got := remaining(); got != 3 {
		t.Errorf("after refunding 3: remaining %d, want 3", got)
	}
	refundNow(t, s, x2req, x2) // found by its number although renamed
	if got := remaining(); got != 4 {
		t.Errorf("after refunding 3 and 1: remaining %d, want 4", got)
	}
	refundNow(t, s, x2req, x2) // once only
	if got := remaining(); got != 4 {
		t.Errorf("after refunding the same charge twice: remaining %d, want 4", got)
	}
	_, c := charge(4)
	// The window holds a (2), b (4), c (4). A unit more waits for a, 3 more for b, 7 for c.
	for _, tt := range []struct {
		cost int64
		by   Result
	}{{1, a}, {2, a}, {3, b}, {6, b}, {7, c}, {10, c}} {
		res := check(t, s, one(l, tt.cost))
		if res.Allowed {
			t.Fatalf("cost %d on a full window allowed", tt.cost)
		}
		if got, want := res.Now.Add(res.Limits[0].RetryAfter), tt.by.Now.Add(time.Hour); !got.Equal(want) {
			t.Errorf("cost %d: retry at %v, want %v, when the charge made at %v expires", tt.cost, got, want, tt.by.Now)
		}
	}
}

// TestStoreSlidingLogSameInstant: charges made at one instant (a clock behind the window's
// newest entry) are entries of one score, ordered by number; a refund finds its own among them.
func TestStoreSlidingLogSameInstant(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	l := lim(key(t, "b"), algorithm.SlidingWindowLog, 100, time.Hour, 0)
	ahead := float64(c.Time(ctx).Val().Add(time.Minute).UnixMicro())
	if err := serverOf(t, c, l.Key).ZAdd(ctx, l.Key, redis.Z{Score: ahead, Member: "!1:1:1"}).Err(); err != nil {
		t.Fatal(err)
	}
	var reqs []Request
	var results []Result
	for _, cost := range []int64{2, 3, 4, 5} {
		req := one(l, cost)
		reqs, results = append(reqs, req), append(results, check(t, s, req))
	}
	refundNow(t, s, reqs[1], results[1])
	refundNow(t, s, reqs[0], results[0])
	got, err := serverOf(t, c, l.Key).ZRangeWithScores(ctx, l.Key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"!1:1:1", "!4:4:5", "!5:5:10"}
	if len(got) != len(want) {
		t.Fatalf("window %v, want members %v", got, want)
	}
	for i, z := range got {
		if z.Member != want[i] || z.Score != ahead {
			t.Errorf("entry %d: %v at %v, want %s at %v", i, z.Member, z.Score, want[i], ahead)
		}
	}
	if res := check(t, s, peekReq(l)); res.Limits[0].Remaining != 90 {
		t.Errorf("remaining %d, want 90", res.Limits[0].Remaining)
	}
}

// TestStoreSlidingLogLegacy: a window written by the script's previous version (one member
// per unit, "<t>-<j>") keeps counting after the upgrade: its live units are converted into a
// few entries, none expiring before its units would have, and its expired ones dropped. The
// same holds for members an old checker appends after new entries during a rolling upgrade.
func TestStoreSlidingLogLegacy(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	const W = time.Hour
	now := c.Time(ctx).Val()
	at := func(d time.Duration) int64 { return now.Add(d).UnixMicro() }
	type run struct {
		t     int64
		units int
	}
	tests := []struct {
		name string
		new  int64 // units charged by the new script first
		old  []run
		// live is the units the window must count; exactAt, when set, is when a unit more
		// can be charged (the oldest live unit's expiry), else it must be at most the newest
		// legacy unit's expiry.
		live    int64
		exactAt int64
	}{
		{"few", 0, []run{{at(-2 * W), 5}, {at(-30 * time.Minute), 2}, {at(-time.Minute), 3}}, 5, at(-30*time.Minute) + W.Microseconds()},
		{"many", 0, []run{{at(-40 * time.Minute), 300}, {at(-20 * time.Minute), 1000}, {at(-time.Second), 7}}, 1307, 0},
		{"one_large_check", 0, []run{{at(-10 * time.Minute), 100_000}}, 100_000, at(-10*time.Minute) + W.Microseconds()},
		{"appended_after_new", 4, []run{{at(time.Second), 6}}, 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), algorithm.SlidingWindowLog, tt.live+5, W, 0)
			if tt.new > 0 {
				// An old checker appends at or after the newest entry.
				res := check(t, s, one(l, tt.new))
				for i := range tt.old {
					tt.old[i].t += res.Now.UnixMicro() - now.UnixMicro()
				}
			}
			srv := serverOf(t, c, l.Key)
			ctx := ctxT(t) // the subtest's own: a parallel subtest may wait long for its turn
			j := 0
			for _, r := range tt.old {
				zs := make([]redis.Z, r.units)
				for i := range zs {
					j++
					zs[i] = zmember(r.t, j)
				}
				if err := srv.ZAdd(ctx, l.Key, zs...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			srv.PExpire(ctx, l.Key, 2*W)
			res := check(t, s, peekReq(l))
			if got, want := res.Limits[0].Used, tt.live; got != want {
				t.Fatalf("after the upgrade the window counts %d units, want %d", got, want)
			}
			if n := srv.ZCard(ctx, l.Key).Val(); n > 65 {
				t.Errorf("the window holds %d entries after conversion, want at most 65", n)
			}
			if res = check(t, s, one(l, 5)); !res.Allowed {
				t.Fatalf("the 5 units left denied: %+v", res.Limits[0])
			}
			res = check(t, s, one(l, 1))
			if res.Allowed {
				t.Fatalf("a unit past the limit allowed after the upgrade")
			}
			retryAt := res.Now.Add(res.Limits[0].RetryAfter).UnixMicro()
			newest := tt.old[len(tt.old)-1].t + W.Microseconds()
			switch {
			case tt.exactAt != 0 && retryAt != tt.exactAt:
				t.Errorf("retry at %d, want %d (when the oldest live legacy unit expires)", retryAt, tt.exactAt)
			case retryAt > newest:
				t.Errorf("retry at %d, after the newest legacy unit expires (%d)", retryAt, newest)
			}
		})
	}
}

// TestStoreSlidingLogMatchesLocal plays one random sequence of charges, peeks and refunds on
// the script and on Local's twin of it and compares every number: the twin keeps runs of
// units, the script entries carrying their cost.
func TestStoreSlidingLogMatchesLocal(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	loc := NewLocal(0)
	const L = 50
	l := lim(key(t, "b"), algorithm.SlidingWindowLog, L, time.Hour, 0)
	deny := lim(key(t, "deny"), algorithm.FixedWindow, 1, long, 0)
	check(t, s, one(deny, 1))
	costs := []int64{3, 1, 7, 2, 9, 20, 1, 4, 11, 6, 1, 1, 13, 5, 8, 30, 2, 50, 9, 40, 3}
	denials := 0
	for i, cost := range costs {
		peek := i%5 == 4
		refund := i%3 == 2
		req := Request{Limits: []Limit{l}, Cost: cost, Peek: peek}
		reqs := []Request{req}
		if refund {
			reqs = append(reqs, one(deny, 1))
		}
		results, err := s.Check(ctxT(t), reqs)
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		got := results[0]
		want := loc.Check(got.Now, Request{Limits: []Limit{l}, Cost: cost, Peek: peek || refund})
		g, w := got.Limits[0], want.Limits[0]
		if !w.Allowed {
			denials++
		}
		if got.Allowed != want.Allowed || g.Used != w.Used || g.Remaining != w.Remaining || !g.ResetAt.Equal(w.ResetAt) || g.RetryAfter != w.RetryAfter {
			t.Errorf("check %d (cost %d, peek %v, refunded %v): store %+v, local %+v", i, cost, peek, refund, g, w)
		}
	}
	if denials < 3 {
		t.Errorf("the sequence made %d denials, want some to compare retry times", denials)
	}
}
