package checker

import (
	"sync/atomic"
	"time"
)

// defaultCircuitFailures is how many store failures in a row open the circuit. One is never
// enough: a single slow round trip (Redis forking for a snapshot) must decide only the checks it
// carried.
const defaultCircuitFailures = 3

// circuit tells the guard when to stop calling the store. It counts only the store's own
// failures: Redis's error replies, a connection refused or broken, a round trip that outlived
// RedisTimeout (bucket.StoreConfig.OnRoundTrip, or the errors a Store passed in returns). A
// caller's deadline or cancellation is never one, so that no caller can open the circuit for
// everyone by giving up early (issue 20: four loops of 1 ms deadlines did).
//
// It opens once threshold failures have come with no success between them AND the first of
// them is at least span (RedisTimeout) old. The span is what keeps a burst from opening it: on
// a checker starved of CPU every batch loop's round trip times out at once — four failures in
// the same instant — and the next round, which finds the burst queued rather than running,
// succeeds. A Redis that is gone fails every round for longer than span; one that refuses
// connections fails at once, and each check meanwhile is decided by its fail mode on its own.
// It stays open until a probe of the store succeeds (guard.probe).
//
// Counting is approximate under concurrency — a success and a failure racing may each win —
// which moves the opening by a round trip.
type circuit struct {
	threshold int64
	span      time.Duration
	now       func() time.Time
	failures  atomic.Int64 // failures since the last success
	first     atomic.Int64 // unix nanoseconds of the first of them
	isOpen    atomic.Bool
	onOpen    func(err error) // called once per opening, by the failure that opened it
}

func newCircuit(threshold int, span time.Duration, onOpen func(error)) *circuit {
	if threshold <= 0 {
		threshold = defaultCircuitFailures
	}
	return &circuit{threshold: int64(threshold), span: span, now: time.Now, onOpen: onOpen}
}

// record counts the outcome of one round trip to the store: nil is a success.
func (c *circuit) record(err error) {
	if err == nil {
		if c.failures.Load() != 0 { // a store on the hot path: skip it when already 0
			c.failures.Store(0)
		}
		return
	}
	now := c.now().UnixNano()
	n := c.failures.Add(1)
	if n == 1 {
		c.first.Store(now)
	}
	if n >= c.threshold && now-c.first.Load() >= int64(c.span) && c.isOpen.CompareAndSwap(false, true) {
		c.onOpen(err)
	}
}

// open reports whether checks must not call the store.
func (c *circuit) open() bool { return c.isOpen.Load() }

// close resumes calling the store with a clean count: a probe found it answering.
func (c *circuit) close() {
	c.failures.Store(0)
	c.isOpen.Store(false)
}
