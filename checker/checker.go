// Package checker is quotaflow's decision engine: it answers "may this request go ahead?" from
// buckets kept in Redis. An Engine turns a Query (subjects, endpoint, cost) into an Outcome by
// matching the rules, planning one bucket request per subject, evaluating them in one atomic
// Redis round trip, and handing the decision to a DecisionSink (the decision stream). It is
// stateless: every checker process shares the buckets in Redis, so any number of them give one
// exact answer.
//
// The engine speaks no wire protocol and its API names only its own types, the rule model of
// package checker/rules (the rules file's format, which rules.Parse reads) and the clients a
// caller already has (go-redis, OpenTelemetry, slog). A program embeds it with a rule set and a
// Redis client: Check and Peek validate every Query and refuse a broken one with a FieldError
// naming the field; a denial is an Outcome, not an error. Package checker/transport serves the
// engine over Connect, gRPC, gRPC-Web, Envoy's rate limit service and an HTTP forward-auth
// endpoint, translating each wire format to and from these types, and package internal/app/admin
// serves the admin API beside it; docs/architecture.md draws the whole path.
package checker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/instance"
)

// Config configures an Engine. The zero value is usable: it talks to Redis on 127.0.0.1:6379
// and is not ready until rules are set.
type Config struct {
	// Redis is the client of the buckets' store; nil means a client for 127.0.0.1:6379, closed
	// by Engine.Close. A client passed in is left open. It must have ContextTimeoutEnabled set,
	// else go-redis ignores RedisTimeout and a stalled Redis stalls every check.
	Redis redis.UniversalClient
	// Rules is the rule set to enforce; nil means none yet (checks fail with ErrNoRules and
	// readiness is false until SetRules).
	Rules *rules.Set
	// RedisTimeout bounds every store call of a check; after it the rules' fail modes decide
	// that check. 0 means 50ms.
	RedisTimeout time.Duration
	// ProbeInterval is how often an unreachable store is probed; while it is unreachable, checks
	// do not wait for it. 0 means 500ms.
	ProbeInterval time.Duration
	// CircuitFailures is how many failed round trips to the store in a row (no success between
	// them, the first at least RedisTimeout before the last) make it unreachable: Redis's
	// errors, refused or broken connections, round trips past RedisTimeout. A caller's deadline
	// or cancellation never counts. 0 means 3.
	CircuitFailures int
	// MaxInFlight bounds the checks (and peeks) waiting for the store at once: past it a new
	// one is answered at once by its rules' fail modes, flagged degraded as if it had waited
	// past RedisTimeout, without calling the store or counting towards its circuit, and counted
	// in quotaflow.checks.shed. An overloaded checker thus answers its excess at once instead of
	// queueing every check into RedisTimeout. 0 means DefaultMaxInFlight; negative means no
	// bound.
	MaxInFlight int
	// BucketLayout is how the buckets are written in Redis: the zero value, PreviousBuckets,
	// for a rolling upgrade from a version before layouts.
	BucketLayout BucketLayout
	// SharedHashes is how many hashes per cluster slot hold the buckets of SharedBuckets:
	// about one per 1.6M buckets, so that a hash holds at most ~100. Changing it starts those
	// buckets over. 0 means 1.
	SharedHashes int
	// LocalMaxKeys bounds the in-process buckets of fail_mode local rules; 0 means 1M.
	LocalMaxKeys int
	// Decisions receives every decision (nil: decisions are not published).
	Decisions DecisionSink
	// InstanceID identifies this checker process in decision ids and events; empty means a
	// random one. A '|' in it becomes '_': the balance journal's entries separate a decision id
	// from its holder with it.
	InstanceID string
	// DisableOverLimitCache turns off the local cache of buckets known to deny until a known
	// instant: every check then goes to the store.
	DisableOverLimitCache bool
	// Meter and Tracer receive the engine's metrics and spans; nil means none.
	Meter  metric.Meter
	Tracer trace.Tracer
	// TraceRatio is the share of checks traced when Tracer is set; 0 means all.
	TraceRatio float64
	// Logger receives the engine's logs, with "component"="checker"; nil means slog.Default().
	Logger *slog.Logger
	// IDKeys sign the ids of reservations and concurrency leases (idsign.go): the first signs,
	// every one verifies, so that a key is rotated by putting the new one first on every
	// checker, and dropping the old once the ids it signed have expired (a day at most). Each
	// must be the same on every checker. Empty means a key the checkers keep in Redis, made by
	// the first that needs it.
	IDKeys [][]byte
	// Caller names the caller of a request from its context: an id is issued to it, and
	// refused to any other. Nil means one caller for all (the engine used as a library).
	Caller CallerFunc
	// JournalGrace is how long a balance's journal entry may wait for its decision to become
	// durable before the journal's sweeper publishes it as a recovered decision (journal.go);
	// the checkers sharing a Redis sweep once per JournalGrace between them. 0 means
	// DefaultJournalGrace. Balances are journaled only when Decisions is set.
	JournalGrace time.Duration

	// store replaces the Redis store in this package's tests (faults, conflicts); it is left
	// open by Close, and judged by the errors its Checks return, its wait past RedisTimeout
	// included.
	store bucketStore
	// clock replaces time.Now where this package's tests need a checker whose clock is off:
	// the calendar periods a check sends are computed from it.
	clock func() time.Time
}

// Engine decides checks. Its methods are safe for concurrent use.
type Engine struct {
	log         *slog.Logger
	rdb         redis.UniversalClient // closed by Close when ownsRedis
	ownsRedis   bool
	ownStore    *bucket.Store // the default Store, stopped by Close
	guard       *guard
	rules       atomic.Pointer[rules.Set]
	sink        DecisionSink
	durable     DurableSink // sink, when it can hold a check until its decision is durable
	instanceID  string
	decisionSeq atomic.Uint64
	olc         *overLimitCache // nil when disabled
	allotments  *allotments     // nil when the store cannot lease
	tel         *instruments
	counts      counts           // Counts, for health reports
	clock       func() time.Time // time.Now but in tests (Config.clock)
	ids         *idSigner
	values      newValues // the descriptor rules' distinct values per window (values.go)
	journal     *journal  // nil when no balance is journaled: no sink, or a store without journals
}

// New returns an Engine for cfg. It does not contact Redis: an unreachable Redis is a degraded
// state, not a start-up failure.
func New(cfg Config) *Engine {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	e := &Engine{
		log:        log.With("component", "checker"),
		rdb:        cfg.Redis,
		sink:       cfg.Decisions,
		instanceID: cfg.InstanceID,
		clock:      cfg.clock,
		ids:        &idSigner{keys: cfg.IDKeys, rdb: cfg.Redis, callerOf: cfg.Caller},
	}
	if e.clock == nil {
		e.clock = time.Now
	}
	e.durable, _ = cfg.Decisions.(DurableSink)
	if e.instanceID == "" {
		e.instanceID = instance.NewID()
	}
	e.instanceID = strings.ReplaceAll(e.instanceID, "|", "_")
	if !cfg.DisableOverLimitCache {
		e.olc = newOverLimitCache(0)
	}
	var err error
	if e.tel, err = newInstruments(cfg.Meter, cfg.Tracer, cfg.TraceRatio); err != nil {
		e.log.Error("metrics disabled: creating instruments failed", "err", err)
		e.tel, _ = newInstruments(nil, cfg.Tracer, cfg.TraceRatio)
	}
	timeout := cfg.RedisTimeout
	if timeout <= 0 {
		timeout = 50 * time.Millisecond
	}
	maxInFlight := cfg.MaxInFlight
	if maxInFlight == 0 {
		maxInFlight = DefaultMaxInFlight
	}
	e.guard = newGuard(guardConfig{
		timeout: timeout, probeEvery: cfg.ProbeInterval, localMaxKeys: cfg.LocalMaxKeys,
		circuitFailures: cfg.CircuitFailures, maxInFlight: int64(maxInFlight), log: e.log,
		observe: e.tel.redis.Record, shed: e.tel.shed.Add,
	})
	store := cfg.store
	if store == nil {
		if e.rdb == nil {
			e.rdb = redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
			e.ownsRedis = true
		}
		if c, ok := e.rdb.(*redis.Client); ok && !c.Options().ContextTimeoutEnabled {
			e.log.Warn("redis client has ContextTimeoutEnabled off: the Redis deadline of checks cannot be enforced")
		}
		// The batches' outcomes, not the checks' errors, feed the circuit: they tell Redis's
		// failures from callers giving up and from this process being slow to read the
		// replies. So a batch gets longer than a check waits (minBatchTimeout): a checker
		// starved of CPU by a burst reads its replies late, its checks are decided by fail
		// mode, but Redis did not fail and the circuit stays closed.
		e.ownStore = bucket.NewStoreWithConfig(e.rdb, bucket.StoreConfig{
			BatchTimeout: max(timeout, minBatchTimeout), OnRoundTrip: e.guard.circuit.record, Logger: e.log,
			Layout: cfg.BucketLayout, SharedHashes: cfg.SharedHashes})
		store = e.ownStore
	}
	e.guard.use(store, cfg.store == nil)
	if l, ok := store.(allotter); ok {
		e.allotments = newAllotments(l, e.guard, e.log, e.tel)
	}
	if js, ok := store.(journalStore); ok && cfg.Decisions != nil {
		grace := cfg.JournalGrace
		if grace <= 0 {
			grace = DefaultJournalGrace
		}
		e.journal = newJournal(e, js, grace)
	}
	if cfg.Rules != nil {
		e.rules.Store(cfg.Rules)
	}
	return e
}

// BucketLayout is how a checker writes the buckets in Redis (Config.BucketLayout;
// docs/architecture.md, "Bucket state in Redis"): the store's own layouts, under the names an
// embedding program uses. Each layout reads the buckets the others wrote as keys;
// SharedBuckets and MixedBuckets read shared hashes' fields too.
type BucketLayout = bucket.Layout

// The bucket layouts (bucket.Layout's, which say more).
const (
	// PreviousBuckets writes what the checkers of the versions before layouts read: keep it
	// while one may still run, as in a rolling upgrade.
	PreviousBuckets = bucket.LayoutPrevious
	// CompactBuckets writes smaller states, which such a checker cannot read.
	CompactBuckets = bucket.LayoutCompact
	// SharedBuckets writes the buckets of fixed_window, gcra and token_bucket as fields of
	// hashes that many buckets share, about half CompactBuckets' memory.
	SharedBuckets = bucket.LayoutShared
	// MixedBuckets is the step of a rolling switch between CompactBuckets and SharedBuckets.
	MixedBuckets = bucket.LayoutMixed
)

// DefaultMaxInFlight is Config.MaxInFlight's default. It is above what a checker answers
// within the default RedisTimeout when it keeps up: a 2-core one decides about 15k checks/s, so
// about 750 are in flight over 50 ms, a much larger one a few thousand; a burst of 3,000 at once
// (TestBurstKeepsCircuitClosed) is decided by Redis, not shed. A check past it would wait in the
// batcher's queue behind more than a RedisTimeout's worth of work, time out, and still cost
// Redis a script call whose answer nobody reads.
const DefaultMaxInFlight = 4096

// minBatchTimeout is the shortest deadline of a batch sent to Redis. A Redis that answers
// nothing within it is down or stalled; a checker that reads its replies later than that has
// been starved of CPU for a second, which a burst on two cores does not do (TestBurstKeepsCircuitClosed:
// about 0.3 s for 3,000 checks at once under the race detector).
const minBatchTimeout = time.Second

// SetRules swaps the enforced rule set atomically; checks in flight finish with the old one.
// Buckets are keyed by subject, algorithm, window and endpoint pattern, so a rule whose limit
// changes keeps what its subjects consumed.
func (e *Engine) SetRules(set *rules.Set) {
	e.rules.Store(set)
	if e.olc != nil {
		e.olc.clear() // a raised limit must not be denied from the cache
	}
	if e.allotments != nil {
		e.allotments.bump() // slices of limits the new rules changed go back at their key's next check
	}
}

// InstanceID identifies this checker in decision ids and events.
func (e *Engine) InstanceID() string { return e.instanceID }

// Rules returns the enforced rule set (nil before any was set).
func (e *Engine) Rules() *rules.Set { return e.rules.Load() }

// Close stops background work (the store's batch loops, the probe) and closes the Redis client
// if the Engine made it. Checks must not be in flight.
func (e *Engine) Close() error {
	if e.journal != nil {
		e.journal.close()
	}
	if e.allotments != nil {
		e.allotments.close() // unused slices go back to Redis while the store still runs
	}
	e.guard.close()
	var err error
	if e.ownStore != nil {
		err = e.ownStore.Close() // stops the batch loops
	}
	if e.ownsRedis {
		err = errors.Join(err, e.rdb.Close())
	}
	return err
}

// Ready reports why the engine cannot make exact decisions, or nil when it can: rules are
// loaded and the store answers.
func (e *Engine) Ready(ctx context.Context) error {
	if e.rules.Load() == nil {
		return ErrNoRules
	}
	return e.guard.ping(ctx)
}

var (
	// ErrNoRules is a check before any rule set was loaded.
	ErrNoRules = errors.New("no rules loaded")
	// ErrUnavailable is an operation that needs the store and has no fail mode (a reset, a
	// usage report) while the store cannot answer.
	ErrUnavailable = errors.New("redis unavailable")
	// errStoreDown is the state the circuit is in: checks are decided by fail mode.
	errStoreDown = errors.New("redis unreachable: decisions are degraded to each rule's fail mode")
)
