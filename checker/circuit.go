package checker

import (
	"sync/atomic"
)

// defaultCircuitFailures is how many store failures in a row open the circuit. One is never
// enough: a single slow round trip (a burst on a loaded machine, Redis forking for a snapshot)
// must decide only the checks it carried. Three is reached within one RedisTimeout when Redis
// is gone (the batch loops fail at once) or stalled (the loops' batches all time out together).
const defaultCircuitFailures = 3

// circuit tells the guard when to stop calling the store. It counts only the store's own
// failures: Redis's error replies, a connection refused or broken, a round trip that outlived
// RedisTimeout (bucket.StoreConfig.OnRoundTrip, or the errors a Store passed in returns). A
// caller's deadline or cancellation is never one, so that no caller can open the circuit for
// everyone by giving up early (issue 20: four loops of 1 ms deadlines did).
//
// It opens after threshold failures with no success between them, and stays open until a
// probe of the store succeeds (guard.probe). Counting is approximate under concurrency — a
// success and a failure racing may each win — which moves the opening by a round trip, never
// opens it on fewer than threshold failures in a row of those recorded.
type circuit struct {
	threshold int64
	failures  atomic.Int64 // failures since the last success
	isOpen    atomic.Bool
	onOpen    func(err error) // called once per opening, by the failure that opened it
}

func newCircuit(threshold int, onOpen func(error)) *circuit {
	if threshold <= 0 {
		threshold = defaultCircuitFailures
	}
	return &circuit{threshold: int64(threshold), onOpen: onOpen}
}

// record counts the outcome of one round trip to the store: nil is a success.
func (c *circuit) record(err error) {
	if err == nil {
		if c.failures.Load() != 0 { // a store on the hot path: skip it when already 0
			c.failures.Store(0)
		}
		return
	}
	if c.failures.Add(1) >= c.threshold && c.isOpen.CompareAndSwap(false, true) {
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
