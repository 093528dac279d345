package health

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
)

// Engine is what a checker's report reads of its decision engine (*checker.Engine).
type Engine interface {
	InstanceID() string
	Counts() checker.Counts
	Outage() (checker.Outage, bool)
	Rules() *rules.Set
	// Ready pings Redis (once the rules are loaded): a ping counts towards the circuit as a
	// check's round trip does, as /readyz's does.
	Ready(ctx context.Context) error
}

// Checker is a checker process's Source.
type Checker struct {
	Engine Engine
	NATS   *nats.Conn
	prev   checker.Counts // at the last Observe
}

// Role is RoleChecker.
func (c *Checker) Role() string { return RoleChecker }

// Instance is the engine's instance id.
func (c *Checker) Instance() string { return c.Engine.InstanceID() }

// Observe reports Redis as the engine sees it (its circuit, then a ping), NATS, the checks
// per second by outcome and, while the circuit is open, every rule as answered by fail mode.
func (c *Checker) Observe(ctx context.Context, r *Report, interval time.Duration) {
	r.Dependencies[NATS] = natsState(c.NATS)
	view := &CheckerView{}
	r.Checker = view
	cur := c.Engine.Counts()
	if interval > 0 {
		per := func(now, before int64) float64 { return float64(now-before) / interval.Seconds() }
		view.Rates = Rates{Allowed: per(cur.Allowed, c.prev.Allowed), Delayed: per(cur.Delayed, c.prev.Delayed),
			Denied: per(cur.Denied, c.prev.Denied), Degraded: per(cur.Degraded, c.prev.Degraded)}
	}
	c.prev = cur
	set := c.Engine.Rules()
	if out, down := c.Engine.Outage(); down {
		r.Dependencies[Redis] = Dependency{State: StateDown, Error: errText(out.Err), Since: out.Since}
		if set != nil {
			for _, rule := range set.Rules() {
				view.FailMode = append(view.FailMode, FailModeRule{Rule: rule.ID, FailMode: rule.FailMode.String(),
					Reason: "redis unreachable (circuit open)"})
			}
		}
		return
	}
	if set == nil {
		r.Dependencies[Redis] = Dependency{State: StateUnknown, Error: "no rules loaded yet"}
		return
	}
	if err := c.Engine.Ready(ctx); err != nil {
		r.Dependencies[Redis] = Dependency{State: StateDown, Error: err.Error()}
		return
	}
	r.Dependencies[Redis] = Dependency{State: StateOK}
}

// Aggregate is what an aggregator's report reads of it (*aggregator.Aggregator).
type Aggregate interface {
	InstanceID() string
	Stats() aggregator.Stats
	Leader() bool
}

// Pinger is a ClickHouse connection (driver.Conn).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Aggregator is an aggregator process's Source.
type Aggregator struct {
	Aggregator Aggregate
	ClickHouse Pinger
	NATS       *nats.Conn
	prev       aggregator.Stats // at the last Observe
}

// Role is RoleAggregator.
func (a *Aggregator) Role() string { return RoleAggregator }

// Instance is the aggregator's instance id.
func (a *Aggregator) Instance() string { return a.Aggregator.InstanceID() }

// Observe reports NATS, ClickHouse (a ping, and down while inserts fail with none succeeding),
// the lag, the partitions owned and the leader flag.
func (a *Aggregator) Observe(ctx context.Context, r *Report, interval time.Duration) {
	r.Dependencies[NATS] = natsState(a.NATS)
	s := a.Aggregator.Stats()
	view := &AggregatorView{Lag: s.Lag, Partitions: s.Owned, Leader: a.Aggregator.Leader()}
	if interval > 0 {
		view.Inserts, view.InsertErrors = s.Inserts-a.prev.Inserts, s.ClickHouseErrors-a.prev.ClickHouseErrors
	}
	a.prev = s
	r.Aggregator = view
	switch err := a.ClickHouse.Ping(ctx); {
	case err != nil:
		r.Dependencies[ClickHouse] = Dependency{State: StateDown, Error: err.Error()}
	case view.InsertErrors > 0 && view.Inserts == 0:
		r.Dependencies[ClickHouse] = Dependency{State: StateDown, Error: "inserts failing (the server answers pings)"}
	default:
		r.Dependencies[ClickHouse] = Dependency{State: StateOK}
	}
}

// natsState is the connection's state. A process whose NATS is down cannot store its report:
// this is seen only in a report taken while reconnecting and stored after.
func natsState(nc *nats.Conn) Dependency {
	if nc == nil {
		return Dependency{State: StateUnknown}
	}
	if nc.IsConnected() {
		return Dependency{State: StateOK}
	}
	msg := "not connected"
	if err := nc.LastError(); err != nil {
		msg = err.Error()
	}
	return Dependency{State: StateDown, Error: msg}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
