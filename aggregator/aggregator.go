// Package aggregator turns the JetStream decision stream into quotaflow's ClickHouse audit
// (table decisions) and, through materialized views, its usage rollups, exactly once.
//
// Each stream partition (subject quotaflow.decisions.<p>) has a durable pull consumer with a
// pinned priority group, so that one aggregator at a time receives it, in order. Aggregator
// processes find each other through a NATS KV bucket of heartbeats and split the partitions
// (KV bucket <stream>_AGGREGATORS); when one dies its heartbeat expires, the others take its partitions,
// and the server moves the pin once the dead one's pin times out.
//
// Exactly once: every row carries its stream partition and sequence, and the INSERT that
// stores a batch also records each message's (partition, sequence) in ingested_messages
// through a materialized view. Before handing a fetched message on, the aggregator looks its
// sequence up there and skips (and acks) what is stored; it acks the others only after
// ClickHouse accepted their insert. A copy redelivered while the first waits in the writer
// can be looked up before that insert commits: the writer remembers what its inserts
// committed since the copy's lookup began, and stores such a copy no more (writer.go). After
// a failed insert, whose outcome is unknown, nothing is sent again until a recheck in
// ingested_messages succeeded. On current servers inserts also carry
// insert_deduplication_token. docs/aggregator.md has the whole argument and its limits.
//
// Each partition's owner also runs the warning-state machine of the partition's subjects
// (warnings.go): it publishes every transition to the events stream with a deterministic id
// and keeps the states in the KV bucket <stream>_WARNINGS, so that a restart or a successor
// neither repeats nor misses a transition. All aggregators store the events stream in
// ClickHouse (events.go). docs/warnings.md has the argument.
//
// Given the rule store (Config.RuleStore), the aggregator follows its rules (the warning
// thresholds), publishes the expiry events of its overrides and, as the leader, applies the
// rules' policies (policy.go), as long as Run runs (rulestore.go).
package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/retry"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/sync/errgroup"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/webhook"
	"github.com/quotaflow/quotaflow/schema"
)

// Config configures an Aggregator. The zero value is usable.
type Config struct {
	// Stream is the decision stream ("QUOTAFLOW_DECISIONS"); SubjectPrefix its subjects'
	// prefix ("quotaflow.decisions"); Partitions their number (16), as the checkers publish.
	Stream        string
	SubjectPrefix string
	Partitions    int
	// Replicas is the replica count of the buckets the aggregators share (members, warning
	// states) and of the events stream when the aggregator creates it (1): as many as the
	// decision stream's, so that losing a NATS server loses none of them.
	Replicas int
	// Database is the ClickHouse database ("quotaflow").
	Database string
	// Cluster, when set, is the ClickHouse cluster the schema is laid out on
	// (schema.OnCluster): the aggregator migrates ON CLUSTER, inserts into the local replicated
	// tables of the server it is connected to (replication copies them to the other replicas)
	// and reads through the Distributed tables.
	Cluster string
	// InstanceID names this process among the aggregators (a random one when empty).
	InstanceID string
	// BatchRows (50000) and FlushInterval (1s) bound an insert by size and age.
	BatchRows     int
	FlushInterval time.Duration
	// FetchBatch is the number of stream messages (each a batch of decisions) per pull (64).
	FetchBatch int
	// InsertTimeout bounds one insert (5s).
	InsertTimeout time.Duration
	// PinnedTTL is how long a partition stays pinned to an aggregator that stopped pulling:
	// the fail-over time after a crash (10s). It must exceed InsertTimeout.
	PinnedTTL time.Duration
	// Heartbeat is the membership heartbeat (1s); a member is gone after three missed.
	Heartbeat time.Duration
	// AckWait is the consumers' ack wait (30s): messages a dead aggregator had fetched and not
	// stored are redelivered to its successor after it. It must exceed FlushInterval plus
	// InsertTimeout; a live aggregator that gets its own messages again skips the copies.
	AckWait time.Duration
	// MaxBackoff caps the wait between retries while ClickHouse fails (5s).
	MaxBackoff time.Duration
	// RetentionInterval is how often the retention job runs (1h); negative disables it.
	RetentionInterval time.Duration
	// RuleStore, when set, is followed for the rule set, whose warning thresholds the warning
	// states follow and whose policies (penalty, tier protection) the leader applies; Run also
	// publishes its overrides' expiry events. Without it (and without Rules) the thresholds
	// are rules.DefaultThresholds and there are no policies.
	RuleStore RuleStore
	// Rules, for an aggregator without a RuleStore, returns the rule set whose warning
	// thresholds the warning states follow (rules.DefaultThresholds when what it returns is
	// nil). It must be nil when RuleStore is set.
	Rules func() *rules.Set
	// PolicyInterval is how often the rule set's policies are evaluated (1s).
	PolicyInterval time.Duration
	// WarningGrace is how long past a warning timer's instant (event time) the wall clock must
	// be before the timer fires without traffic (1s): decisions of that instant still in
	// flight are applied first.
	WarningGrace time.Duration
	// EventsConsumer is the durable consumer, shared by all aggregators, that stores the
	// events stream (warning transitions, override changes) in ClickHouse
	// ("quotaflow-aggregator-events"). EventsSubjects are its subjects (all events).
	EventsConsumer string
	EventsSubjects []string
	// Webhooks, when set, are the webhook endpoints the entitlement events are delivered to:
	// Run runs a webhook dispatcher that follows them (aggregator/webhooks.go), each
	// aggregator pulling the endpoints' shared consumers, and logs every attempt in ClickHouse
	// (webhook_deliveries). WebhookPolicy is where endpoints may point (public addresses only,
	// when zero); WebhookSchedule when failed deliveries are retried (a day,
	// webhook.DefaultSchedule, when zero).
	Webhooks        WebhookEndpoints
	WebhookPolicy   webhook.URLPolicy
	WebhookSchedule webhook.Schedule
	// Logger receives the logs, with "component"="aggregator" (the policies': "policies");
	// discarded when nil.
	Logger *slog.Logger
	// Meter records metrics (none when nil).
	Meter metric.Meter
}

// Defaults used for zero Config fields.
const (
	// PriorityGroup is the consumers' pinned priority group.
	PriorityGroup = "aggregators"
	// DefaultEventsConsumer is the events stream's durable consumer.
	DefaultEventsConsumer = events.ConsumerName
)

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Stream == "" {
		c.Stream = stream.Name
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = stream.SubjectPrefix
	}
	if c.Partitions == 0 {
		c.Partitions = stream.Partitions
	}
	c.Replicas = max(1, c.Replicas)
	if c.Database == "" {
		c.Database = schema.DefaultDatabase
	}
	if c.InstanceID == "" {
		c.InstanceID = "aggregator-" + instance.NewID()
	}
	if c.BatchRows == 0 {
		c.BatchRows = 50000
	}
	if c.FetchBatch == 0 {
		c.FetchBatch = 64
	}
	def(&c.FlushInterval, time.Second)
	def(&c.InsertTimeout, 5*time.Second)
	def(&c.PinnedTTL, 10*time.Second)
	def(&c.Heartbeat, time.Second)
	def(&c.AckWait, 30*time.Second)
	def(&c.MaxBackoff, 5*time.Second)
	def(&c.RetentionInterval, time.Hour)
	def(&c.WarningGrace, time.Second)
	def(&c.PolicyInterval, time.Second)
	if c.EventsConsumer == "" {
		c.EventsConsumer = DefaultEventsConsumer
	}
	if len(c.EventsSubjects) == 0 {
		c.EventsSubjects = events.Subjects()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Meter == nil {
		c.Meter = noop.NewMeterProvider().Meter("")
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > stream.MaxPartitions:
		return fmt.Errorf("partitions %d: want 1..%d", c.Partitions, stream.MaxPartitions)
	case c.BatchRows < 1:
		return fmt.Errorf("batch rows %d: want at least 1", c.BatchRows)
	case c.FlushInterval < 0 || c.InsertTimeout < 0 || c.Heartbeat < 0 || c.AckWait < 0 || c.MaxBackoff < 0 || c.WarningGrace < 0 || c.PolicyInterval < 0:
		return errors.New("durations must not be negative")
	case c.RuleStore != nil && c.Rules != nil:
		return errors.New("rules and rule store are exclusive: the rule store provides the rules")
	case c.AckWait <= c.FlushInterval+c.InsertTimeout:
		return fmt.Errorf("ack wait %v must exceed the flush interval plus the insert timeout (%v)", c.AckWait, c.FlushInterval+c.InsertTimeout)
	case c.PinnedTTL <= c.InsertTimeout:
		return fmt.Errorf("pinned TTL %v must exceed the insert timeout %v", c.PinnedTTL, c.InsertTimeout)
	case !validKey(c.EventsConsumer) || strings.Contains(c.EventsConsumer, "."):
		return fmt.Errorf("events consumer %q: want letters, digits, '-', '_', '='", c.EventsConsumer)
	case !validKey(c.InstanceID):
		return fmt.Errorf("instance id %q: want letters, digits, '-', '_', '=', '.'", c.InstanceID)
	}
	return nil
}

// Stats are the aggregator's counters since it started.
type Stats struct {
	// Inserted decisions, Skipped duplicates (already stored), Inserts (batches) and
	// ClickHouseErrors (failed inserts and lookups, each retried).
	Inserted, Skipped, Inserts, ClickHouseErrors int64
	// Owned is the number of partitions this process consumes now.
	Owned int
	// Lag is the decisions' messages not yet stored on the owned partitions (not delivered
	// yet, or delivered and not acked), as last measured.
	Lag int64
	// LagAge is the age of the oldest of those messages, from the time the stream received it
	// (the checker's publish), as last measured: 0 when caught up. A decision that waited in a
	// checker's spool first is older than that (the spool shows as the publisher's
	// spool_bytes).
	LagAge time.Duration
	// Transitions are the warning-state transitions this process published (copies the stream
	// dropped as duplicates not counted); EventsStored the events it stored in ClickHouse;
	// EntitlementEvents the entitlement thresholds crossed it published (duplicates not
	// counted).
	Transitions, EventsStored, EntitlementEvents int64
}

// Aggregator consumes decision partitions into ClickHouse.
type Aggregator struct {
	cfg Config
	js  jetstream.JetStream
	ch  driver.Conn
	log *slog.Logger
	m   *instruments

	dialect   schema.Dialect
	items     chan item
	flushReqs chan flushRequest
	// commits counts the writer's committed inserts (see item.commits).
	commits atomic.Uint64

	mu    sync.Mutex
	owned map[int]*partition // partitions being consumed

	warnKV jetstream.KeyValue
	leader atomic.Bool               // see Leader
	set    atomic.Pointer[rules.Set] // the rule store's, as last followed; nil until then

	inserted, skipped, inserts, clickhouseErrors, lag, transitions, eventsStored, entitlementEvents atomic.Int64
	lagAge                                                                                          atomic.Int64 // time.Duration
}

// New returns an Aggregator reading stream messages with js and writing with ch.
func New(js jetstream.JetStream, ch driver.Conn, cfg Config) (*Aggregator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("aggregator config: %w", err)
	}
	a := &Aggregator{
		cfg:       cfg,
		js:        js,
		ch:        ch,
		log:       cfg.Logger.With("component", "aggregator"),
		items:     make(chan item, 4*cfg.FetchBatch),
		flushReqs: make(chan flushRequest),
		owned:     map[int]*partition{},
	}
	m, err := newInstruments(cfg.Meter, a)
	if err != nil {
		return nil, err
	}
	a.m = m
	return a, nil
}

// Stats returns the counters.
func (a *Aggregator) Stats() Stats {
	a.mu.Lock()
	owned := len(a.owned)
	a.mu.Unlock()
	return Stats{
		Inserted: a.inserted.Load(), Skipped: a.skipped.Load(), Inserts: a.inserts.Load(),
		ClickHouseErrors: a.clickhouseErrors.Load(), Owned: owned, Lag: a.lag.Load(), LagAge: time.Duration(a.lagAge.Load()),
		Transitions: a.transitions.Load(), EventsStored: a.eventsStored.Load(), EntitlementEvents: a.entitlementEvents.Load(),
	}
}

// rules returns the current rule set, nil without one.
func (a *Aggregator) rules() *rules.Set {
	if a.cfg.RuleStore != nil {
		return a.set.Load()
	}
	if a.cfg.Rules == nil {
		return nil
	}
	return a.cfg.Rules()
}

// InstanceID is this aggregator's name among its peers.
func (a *Aggregator) InstanceID() string { return a.cfg.InstanceID }

// Run migrates the schema (retrying while ClickHouse is unreachable), creates the consumers,
// joins the aggregators and consumes until ctx ends. Then it finishes the insert in flight,
// acks what was stored and gives its partitions up, so that a peer takes them at once.
//
// With a RuleStore, Run first loads its rules (waiting up to 10s when it holds some) and, for
// as long as it runs, follows them, publishes the overrides' expiry events and runs the
// policies; these tasks have stopped when Run returns, so that the caller may then close the
// connections.
func (a *Aggregator) Run(ctx context.Context) error {
	stopRuleTasks := a.startRuleTasks(ctx)
	defer stopRuleTasks()
	if ctx.Err() != nil {
		return nil // stopped while waiting for the rules: nothing was consumed
	}
	if err := a.migrate(ctx); err != nil {
		return err
	}
	if err := a.ensureConsumers(ctx); err != nil {
		return err
	}
	ensure := broker.EnsureConfig{Replicas: a.cfg.Replicas, MaxBackoff: a.cfg.MaxBackoff}
	var members jetstream.KeyValue
	err := broker.Ensure(ctx, a.log, "members bucket", ensure, func(ctx context.Context) (err error) {
		members, err = a.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: a.cfg.Stream + "_AGGREGATORS", Description: "quotaflow aggregator heartbeats", TTL: 3 * a.cfg.Heartbeat,
			History: 1, Replicas: a.cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return err
	}
	err = broker.Ensure(ctx, a.log, "warnings bucket", ensure, func(ctx context.Context) (err error) {
		a.warnKV, err = a.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: a.warningsBucket(), Description: "quotaflow warning states per partition, subject and rule", History: 1,
			Replicas: a.cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return err
	}
	if err := broker.Ensure(ctx, a.log, "events stream", ensure, a.ensureEventsStream); err != nil {
		return err
	}
	writerCtx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWriter()
	writerDone := make(chan error, 1)
	go func() { writerDone <- a.writeLoop(writerCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.membershipLoop(gctx, members) })
	g.Go(func() error { a.lagLoop(gctx); return nil })
	g.Go(func() error { a.eventsLoop(gctx); return nil })
	if a.cfg.Webhooks != nil {
		g.Go(func() error { a.webhookLoop(gctx); return nil })
	}
	if a.cfg.RetentionInterval > 0 {
		g.Go(func() error { a.retentionLoop(gctx); return nil })
	}
	err = g.Wait()
	// Stop pulling, let the writer flush what it holds (bounded by the insert timeout), then
	// unpin so that a peer need not wait for the pin to time out.
	owned := a.releaseAll()
	stopWriter()
	if werr := <-writerDone; werr != nil && err == nil {
		err = werr
	}
	unpinCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for _, p := range owned {
		a.unpin(unpinCtx, p)
	}
	members.Delete(unpinCtx, a.cfg.InstanceID)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// migrate applies the schema, retrying with backoff while ClickHouse is unreachable.
func (a *Aggregator) migrate(ctx context.Context) error {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		d, applied, err := a.layout().Migrate(ctx, a.ch, a.cfg.Database)
		if err == nil {
			a.dialect = d
			a.log.Info("schema ready", "database", a.cfg.Database, "server", d.Version, "dialect", d.String(), "applied", applied)
			return nil
		}
		wait := b.Next()
		a.log.Warn("schema migration failed; retrying", "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return fmt.Errorf("migrate: %w", err)
		}
	}
}

// layout is the schema's layout: one server, or Config.Cluster's.
func (a *Aggregator) layout() schema.Layout { return schema.OnCluster(a.cfg.Cluster) }

// ensureConsumers creates or updates one durable consumer per partition.
func (a *Aggregator) ensureConsumers(ctx context.Context) error {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for p := 0; p < a.cfg.Partitions; p++ {
		for {
			// A request in flight when its server dies is never answered: bound each attempt.
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := a.js.CreateOrUpdateConsumer(actx, a.cfg.Stream, a.consumerConfig(p))
			cancel()
			if err == nil {
				break
			}
			wait := b.Next()
			a.log.Warn("create consumer failed; retrying (is the stream there? checkers create it)", "partition", p, "err", err, "retry_in", wait)
			if !retry.Sleep(ctx, wait) {
				return fmt.Errorf("create consumer for partition %d: %w", p, err)
			}
		}
	}
	return nil
}

// ConsumerName is the durable consumer of partition p.
func ConsumerName(p int) string { return stream.ConsumerName(p) }

func (a *Aggregator) consumerConfig(p int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        ConsumerName(p),
		Description:    "quotaflow aggregator, decisions of one partition into ClickHouse",
		FilterSubject:  stream.Subject(a.cfg.SubjectPrefix, p),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        a.cfg.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  100000,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      a.cfg.PinnedTTL,
	}
}
