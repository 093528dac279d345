// Package health shares each quotaflow process's own view of its dependencies, so that an
// operator sees in one place what every checker and aggregator sees: a checker that cannot
// reach Redis while the others can, an aggregator whose ClickHouse inserts fail, a backlog
// growing, the rules answered by fail mode right now. A process's /readyz answers only for
// itself and only to whoever can reach its port; `quotaflow status` and the web console read
// every process's view from NATS instead.
//
// Every checker and aggregator runs a Reporter: every Config.Interval it puts a Report as JSON
// into the JetStream KeyValue bucket QUOTAFLOW_HEALTH under "<role>.<instance>". The bucket
// keeps a key for a few intervals (Config.Interval times KeepIntervals, set by the process
// that creates the bucket), so a process that died disappears from List by itself. A process
// that lost NATS cannot report either: it disappears the same way.
package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is the KeyValue bucket of the reports.
const Bucket = "QUOTAFLOW_HEALTH"

// The roles of the processes that report.
const (
	RoleChecker    = "checker"
	RoleAggregator = "aggregator"
)

// The dependencies a report names.
const (
	Redis      = "redis"
	NATS       = "nats"
	ClickHouse = "clickhouse"
)

// State is how a process sees one of its dependencies.
type State string

// The states of a dependency.
const (
	StateOK      State = "ok"
	StateDown    State = "down"
	StateUnknown State = "unknown" // not asked yet (a checker without rules does not ping Redis)
)

// Report is one process's view of itself and its dependencies, as of At.
type Report struct {
	Role     string    `json:"role"` // RoleChecker or RoleAggregator
	Instance string    `json:"instance"`
	Version  string    `json:"version"`
	Host     string    `json:"host"`
	Started  time.Time `json:"started"`
	At       time.Time `json:"at"`
	// Interval is the time between this process's reports; rates are over the last one.
	Interval time.Duration `json:"interval_ns"`
	// Dependencies are keyed Redis, NATS or ClickHouse: whichever the process uses.
	Dependencies map[string]Dependency `json:"dependencies"`
	// Checker is set in a checker's report, Aggregator in an aggregator's.
	Checker    *CheckerView    `json:"checker,omitempty"`
	Aggregator *AggregatorView `json:"aggregator,omitempty"`
}

// Dependency is a dependency's state as one process sees it.
type Dependency struct {
	State State `json:"state"`
	// Error is the last failure while down.
	Error string `json:"error,omitempty"`
	// Since is when the process first saw the current state.
	Since time.Time `json:"since"`
}

// CheckerView is what a checker reports beyond its dependencies.
type CheckerView struct {
	// Rates are the checks decided per second over the last interval, by outcome; Degraded
	// are those decided by their rules' fail modes (Redis unreachable or slow, or the checker
	// overloaded), whatever their answer.
	Rates Rates `json:"checks_per_second"`
	// FailMode lists the rules answered by their fail modes now: every rule while Redis is
	// unreachable (its circuit open). Empty while Redis answers.
	FailMode []FailModeRule `json:"fail_mode,omitempty"`
}

// Rates are checks per second by outcome.
type Rates struct {
	Allowed  float64 `json:"allowed"`
	Delayed  float64 `json:"delayed"`
	Denied   float64 `json:"denied"`
	Degraded float64 `json:"degraded"`
}

// Total is the checks per second of every outcome.
func (r Rates) Total() float64 { return r.Allowed + r.Delayed + r.Denied + r.Degraded }

// FailModeRule is a rule a checker answers by its fail mode.
type FailModeRule struct {
	Rule     string `json:"rule"`
	FailMode string `json:"fail_mode"` // open, closed or local
	Reason   string `json:"reason"`
}

// AggregatorView is what an aggregator reports beyond its dependencies.
type AggregatorView struct {
	// Lag is the stream messages (batches of decisions) not yet stored on the partitions it
	// owns, as last measured. The stream does not tell their age, so there is no lag in
	// seconds.
	Lag int64 `json:"lag_messages"`
	// Partitions is how many decision-stream partitions it consumes; Leader whether it runs
	// the policies.
	Partitions int  `json:"partitions_owned"`
	Leader     bool `json:"leader"`
	// Inserts and InsertErrors are its ClickHouse inserts (batches) and failed inserts and
	// lookups over the last interval.
	Inserts      int64 `json:"inserts"`
	InsertErrors int64 `json:"insert_errors"`
}

// Down lists the dependencies the report sees down, sorted.
func (r *Report) Down() []string {
	var down []string
	for name, d := range r.Dependencies {
		if d.State == StateDown {
			down = append(down, name)
		}
	}
	slices.Sort(down)
	return down
}

// List returns the reports of the processes alive now (whose last report has not expired),
// checkers first, each role sorted by instance. No bucket yet (no process ever reported) is an
// empty list, not an error.
func List(ctx context.Context, js jetstream.JetStream) ([]Report, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("health bucket: %w", err)
	}
	// A listing counts the keys it will be sent when it starts: a report that expires before
	// it is sent leaves the listing waiting for it until its context ends. Each attempt has a
	// deadline of its own, and one that passes is tried again.
	for {
		actx, cancel := context.WithTimeout(ctx, listAttempt)
		out, err := list(actx, kv)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return out, err
		}
	}
}

// listAttempt bounds one listing of the reports: a handful of keys, read in milliseconds.
const listAttempt = 2 * time.Second

// list reads every report of kv once.
func list(ctx context.Context, kv jetstream.KeyValue) ([]Report, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list health reports: %w", err)
	}
	var out []Report
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired since listed
		} else if err != nil {
			return nil, fmt.Errorf("read health report %s: %w", k, err)
		}
		var r Report
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			return nil, fmt.Errorf("decode health report %s: %w", k, err)
		}
		out = append(out, r)
	}
	if err := ctx.Err(); err != nil {
		// The listing stops at ctx's end without saying so: a partial list would hide processes.
		return nil, fmt.Errorf("list health reports: %w", err)
	}
	slices.SortFunc(out, func(a, b Report) int {
		if a.Role != b.Role {
			return compareRole(a.Role, b.Role)
		}
		return cmp.Compare(a.Instance, b.Instance)
	})
	return out, nil
}

func compareRole(a, b string) int {
	if a == RoleChecker {
		return -1
	}
	if b == RoleChecker {
		return 1
	}
	return cmp.Compare(a, b)
}
