package bucket

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestQueue: a limit with a MaxDelay (a leaky bucket used as a queue) allows the charges past
// its capacity after a delay, at slots spaced exactly window/limit apart per unit of cost, and
// denies a charge whose delay would pass MaxDelay, with the wait until one would not. algorithm.GCRA and
// leaky bucket, through Redis and through Local, alike.
func TestQueue(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, c := range twins(s, 3*time.Millisecond) {
		for _, alg := range []algorithm.ID{algorithm.GCRA, algorithm.LeakyBucket} {
			t.Run(c.name+"/"+alg.String(), func(t *testing.T) {
				// 10 in 10 s, one at once: a slot every second, 3.5 s of queue (long, so that a
				// loaded machine's slow calls do not empty it).
				l := lim(key(t, "q"), alg, 10, 10*time.Second, 1)
				l.MaxDelay = 3500 * time.Millisecond
				var releases []time.Time
				for i := range 4 {
					res := c.one(t, one(l, 1))
					lr := res.Limits[0]
					if !res.Allowed || lr.Delay > l.MaxDelay || i == 0 && lr.Delay != 0 || i > 0 && lr.Delay == 0 {
						t.Fatalf("charge %d: allowed %v delay %v, want allowed, delayed by 0 < d <= 3.5s but the first", i+1, res.Allowed, lr.Delay)
					}
					releases = append(releases, res.Now.Add(lr.Delay))
				}
				// The first is released at once, the others at its time plus 1 s, 2 s, 3 s: to
				// the µs, whatever time the charges took to arrive.
				for i := 1; i < len(releases); i++ {
					if gap := releases[i].Sub(releases[i-1]); gap < time.Second-2*time.Microsecond || gap > time.Second+2*time.Microsecond {
						t.Errorf("release %d comes %v after the one before, want 1s (±2µs)", i+1, gap)
					}
				}
				// A fifth would wait about 4 s: denied, until the queue has room.
				res := c.one(t, one(l, 1))
				if lr := res.Limits[0]; res.Allowed || lr.RetryAfter <= 0 || lr.RetryAfter > time.Second || lr.Delay != 0 {
					t.Errorf("charge past the queue: allowed %v retry %v delay %v, want denied, retry in at most 1s", res.Allowed, lr.RetryAfter, lr.Delay)
				}
				// A peek reports no delay and charges nothing.
				if res := c.one(t, peekReq(l)); res.Limits[0].Delay != 0 {
					t.Errorf("peek delay %v, want 0", res.Limits[0].Delay)
				}
			})
		}
	}
}

// TestQueueBatch: concurrent queued charges (decided in one script run when they meet in a
// batch) get slots spaced by their costs: 2 units a slot of 200 ms.
func TestQueueBatch(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	l := lim(key(t, "q"), algorithm.GCRA, 10, time.Second, 2)
	l.MaxDelay = time.Second
	reqs := []Request{one(l, 2), one(l, 2), one(l, 2)}
	results := make([]Result, len(reqs))
	done := make(chan int)
	for i := range reqs {
		go func() {
			res, err := s.Check(ctxT(t), reqs[i:i+1])
			if err != nil {
				t.Error(err)
			} else {
				results[i] = res[0]
			}
			done <- i
		}()
	}
	for range reqs {
		<-done
	}
	var releases []time.Time
	for _, res := range results {
		releases = append(releases, res.Now.Add(res.Limits[0].Delay))
	}
	slices.SortFunc(releases, time.Time.Compare)
	for i := 1; i < len(releases); i++ {
		if gap := releases[i].Sub(releases[i-1]); gap < 200*time.Millisecond-2*time.Microsecond || gap > 200*time.Millisecond+2*time.Microsecond {
			t.Errorf("release %d comes %v after the one before, want 200ms (±2µs): 2 units at 10 a second", i+1, gap)
		}
	}
}

// TestQueueRefused: only algorithm.GCRA and leaky bucket queue.
func TestQueueRefused(t *testing.T) {
	t.Parallel()
	l := lim("{x}:a", algorithm.TokenBucket, 10, time.Second, 10)
	l.MaxDelay = time.Second
	req := one(l, 1)
	if err := req.Validate(); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Validate of a queued token bucket = %v, want ErrInvalidRequest", err)
	}
}
