package bucket

import (
	"fmt"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestStoreRetryAfter checks RetryAfter and ResetAt against each algorithm's formula, on long
// windows where Redis time barely moves relative to them.
func TestStoreRetryAfter(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	const L = 5
	T := long / L // one unit's period
	tests := []struct {
		alg  algorithm.ID
		cost int64
		// want computes the expected retry after and reset from the denied result.
		want func(res Result) (retry time.Duration, reset time.Time)
		tol  time.Duration
	}{
		{algorithm.TokenBucket, 1, func(r Result) (time.Duration, time.Time) { return T, r.Now.Add(long) }, time.Second},
		{algorithm.TokenBucket, 3, func(r Result) (time.Duration, time.Time) { return 3 * T, r.Now.Add(long) }, time.Second},
		{algorithm.LeakyBucket, 1, func(r Result) (time.Duration, time.Time) { return T, r.Now.Add(long) }, time.Second},
		{algorithm.LeakyBucket, 3, func(r Result) (time.Duration, time.Time) { return 3 * T, r.Now.Add(long) }, time.Second},
		{algorithm.GCRA, 1, func(r Result) (time.Duration, time.Time) { return T, r.Now.Add(long) }, time.Second},
		{algorithm.GCRA, 3, func(r Result) (time.Duration, time.Time) { return 3 * T, r.Now.Add(long) }, time.Second},
		{algorithm.FixedWindow, 1, func(r Result) (time.Duration, time.Time) {
			end := windowEnd(r.Now, long)
			return end.Sub(r.Now), end
		}, 0},
		{algorithm.SlidingWindowLog, 1, func(r Result) (time.Duration, time.Time) { return long, r.Now.Add(long) }, time.Second},
		{algorithm.SlidingWindowLog, 3, func(r Result) (time.Duration, time.Time) { return long, r.Now.Add(long) }, time.Second},
		{algorithm.SlidingWindowCounter, 1, func(r Result) (time.Duration, time.Time) {
			// c = 5, p = 0: in the next window weighted = 5 * (1 - pos) must reach 4.
			end := windowEnd(r.Now, long)
			return end.Sub(r.Now) + long/5, end.Add(long)
		}, time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/cost_%d", tt.alg, tt.cost), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), tt.alg, L, long, 0)
			if res := check(t, s, one(l, L)); !res.Allowed {
				t.Fatalf("first check of the whole capacity denied")
			}
			res := check(t, s, one(l, tt.cost))
			checkInvariants(t, one(l, tt.cost), res)
			if res.Allowed {
				t.Fatalf("check past the limit allowed")
			}
			wantRetry, wantReset := tt.want(res)
			lr := res.Limits[0]
			if !near(lr.RetryAfter, wantRetry, tt.tol) {
				t.Errorf("retry after: got %v, want %v ± %v", lr.RetryAfter, wantRetry, tt.tol)
			}
			if !near(lr.ResetAt.Sub(wantReset), 0, tt.tol) {
				t.Errorf("reset at: got %v, want %v ± %v", lr.ResetAt, wantReset, tt.tol)
			}
		})
	}
}

func windowEnd(now time.Time, w time.Duration) time.Time {
	us, wus := now.UnixMicro(), w.Microseconds()
	return time.UnixMicro((us/wus + 1) * wus)
}

// TestStoreRefill exhausts a short-window limit, waits for the RetryAfter it was given and
// expects the next check to pass; after ResetAt, the whole capacity must be back.
func TestStoreRefill(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	const L, W = 5, 100 * time.Millisecond
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), a, L, W, 0)
			var denied Result
			for i := 0; ; i++ {
				res := check(t, s, one(l, 1))
				checkInvariants(t, one(l, 1), res)
				if !res.Allowed {
					denied = res
					break
				}
				if i > 2*L {
					t.Fatalf("%d checks allowed with limit %d per %v", i+1, L, W)
				}
			}
			retry := denied.Limits[0].RetryAfter
			if retry <= 0 || retry > 2*W {
				t.Fatalf("retry after %v, want in (0, %v]", retry, 2*W)
			}
			time.Sleep(retry + 2*time.Millisecond)
			if res := check(t, s, one(l, 1)); !res.Allowed {
				t.Errorf("check after waiting the retry after %v denied (retry after now %v)", retry, res.Limits[0].RetryAfter)
			}
			peek := check(t, s, peekReq(l))
			time.Sleep(time.Until(peek.Limits[0].ResetAt) + 2*time.Millisecond)
			if res := check(t, s, peekReq(l)); res.Limits[0].Remaining != L || res.Limits[0].Used != 0 {
				t.Errorf("after reset at: got used %d remaining %d, want 0 %d", res.Limits[0].Used, res.Limits[0].Remaining, L)
			}
		})
	}
}

// TestLocalTiming drives Local with explicit times to check the exact retry, reset and refill
// of each algorithm: 5 per 100 ms, exhausted 30 ms into a window.
func TestLocalTiming(t *testing.T) {
	t.Parallel()
	const L, W = 5, 100 * time.Millisecond
	start := time.UnixMicro(1_900_000_000_000_000) // a window boundary
	t0 := start.Add(30 * time.Millisecond)
	ms := time.Millisecond
	tests := []struct {
		alg   algorithm.ID
		retry time.Duration
		reset time.Time
	}{
		{algorithm.TokenBucket, 20 * ms, t0.Add(W)},
		{algorithm.LeakyBucket, 20 * ms, t0.Add(W)},
		{algorithm.GCRA, 20 * ms, t0.Add(W)},
		{algorithm.FixedWindow, 70 * ms, start.Add(W)},
		{algorithm.SlidingWindowLog, W, t0.Add(W)},
		{algorithm.SlidingWindowCounter, 90 * ms, start.Add(2 * W)},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			t.Parallel()
			loc := NewLocal(0)
			l := lim("k", tt.alg, L, W, 0)
			if res := loc.Check(t0, one(l, L)); !res.Allowed {
				t.Fatalf("whole capacity at once denied")
			}
			res := loc.Check(t0, one(l, 1))
			checkInvariants(t, one(l, 1), res)
			lr := res.Limits[0]
			if res.Allowed || lr.RetryAfter != tt.retry || !lr.ResetAt.Equal(tt.reset) {
				t.Errorf("got allowed %v retry %v reset %v, want false %v %v", res.Allowed, lr.RetryAfter, lr.ResetAt, tt.retry, tt.reset)
			}
			if res := loc.Check(t0.Add(tt.retry-time.Microsecond), one(l, 1)); res.Allowed {
				t.Errorf("allowed 1µs before the retry after")
			}
			if res := loc.Check(t0.Add(tt.retry), one(l, 1)); !res.Allowed {
				t.Errorf("denied at the retry after: %+v", res.Limits[0])
			}
			later := tt.reset.Add(2 * W)
			if res := loc.Check(later, peekReq(l)); res.Limits[0].Remaining != L {
				t.Errorf("long after reset: remaining %d, want %d", res.Limits[0].Remaining, L)
			}
		})
	}
}

// TestLocalSlidingCounterWeight checks the weighting of the previous window.
func TestLocalSlidingCounterWeight(t *testing.T) {
	t.Parallel()
	const W = 100 * time.Millisecond
	start := time.UnixMicro(1_900_000_000_000_000)
	loc := NewLocal(0)
	l := lim("k", algorithm.SlidingWindowCounter, 10, W, 0)
	if res := loc.Check(start.Add(50*time.Millisecond), one(l, 10)); !res.Allowed {
		t.Fatalf("first window: 10 of 10 denied")
	}
	mid := start.Add(W + 50*time.Millisecond) // previous 10 weighted by half
	if res := loc.Check(mid, peekReq(l)); res.Limits[0].Used != 5 || res.Limits[0].Remaining != 5 {
		t.Errorf("half into the next window: got used %d remaining %d, want 5 5", res.Limits[0].Used, res.Limits[0].Remaining)
	}
	if res := loc.Check(mid, one(l, 5)); !res.Allowed {
		t.Errorf("5 more denied")
	}
	res := loc.Check(mid, one(l, 1))
	// weighted = 10 * (1 - pos) + 5 must reach 9: pos = 0.6, 10 ms from now.
	if res.Allowed || res.Limits[0].RetryAfter != 10*time.Millisecond {
		t.Errorf("got allowed %v retry %v, want false 10ms", res.Allowed, res.Limits[0].RetryAfter)
	}
	if res := loc.Check(mid.Add(10*time.Millisecond), one(l, 1)); !res.Allowed {
		t.Errorf("denied at the retry after")
	}
}

// TestLocalClockBack steps the clock back after exhausting a bucket: nothing may come back and
// nothing may break.
func TestLocalClockBack(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMicro(1_900_000_000_050_000)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			loc := NewLocal(0)
			l := lim("k", a, 5, 100*time.Millisecond, 0)
			if res := loc.Check(t0, one(l, 5)); !res.Allowed {
				t.Fatalf("whole capacity denied")
			}
			for _, back := range []time.Duration{time.Microsecond, 40 * time.Millisecond, time.Hour} {
				res := loc.Check(t0.Add(-back), one(l, 1))
				checkInvariants(t, one(l, 1), res)
				if res.Allowed || res.Limits[0].Remaining != 0 {
					t.Errorf("%v back: got allowed %v remaining %d, want false 0", back, res.Allowed, res.Limits[0].Remaining)
				}
			}
			// Time resumes: the bucket refills as if the clock had never gone back.
			if res := loc.Check(t0.Add(time.Second), one(l, 1)); !res.Allowed {
				t.Errorf("1s later: denied")
			}
		})
	}
}
