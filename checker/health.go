package checker

import (
	"sync/atomic"
	"time"
)

// Counts are the consuming checks an Engine decided since it started, by outcome. The four are
// disjoint: a check decided by its rules' fail modes counts as Degraded whatever its answer, so
// that the others are the exact decisions. Health reports turn their differences into rates.
type Counts struct {
	Allowed, Delayed, Denied, Degraded int64
}

// counts are an Engine's Counts: one atomic add per check, no lock on the hot path.
type counts struct {
	allowed, delayed, denied, degraded atomic.Int64
}

func (c *counts) add(out *Outcome) {
	switch {
	case out.Degraded:
		c.degraded.Add(1)
	case out.Delay > 0:
		c.delayed.Add(1)
	case out.Allowed:
		c.allowed.Add(1)
	default:
		c.denied.Add(1)
	}
}

// Counts returns the checks decided so far, by outcome.
func (e *Engine) Counts() Counts {
	c := &e.counts
	return Counts{Allowed: c.allowed.Load(), Delayed: c.delayed.Load(), Denied: c.denied.Load(), Degraded: c.degraded.Load()}
}

// Outage is Redis being unreachable as the engine sees it: its circuit is open, so every check
// is decided by its rules' fail modes without calling Redis until a probe finds it answering.
type Outage struct {
	// Since is when the circuit opened; Err the failure that opened it.
	Since time.Time
	Err   error
}

// Outage reports whether Redis is unreachable now (the circuit is open) and since when.
func (e *Engine) Outage() (Outage, bool) {
	if !e.guard.circuit.open() {
		return Outage{}, false
	}
	if o := e.guard.outage.Load(); o != nil {
		return *o, true
	}
	// Opened a moment ago: opened has not stored the outage yet.
	return Outage{Since: time.Now(), Err: errStoreDown}, true
}
