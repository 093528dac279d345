package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/schema"
)

type aggregatorFlags struct {
	cfg       daemon.AggregatorConfig
	natsTLS   clientTLSFlags
	ch        clickhouseFlags
	logLevel  string
	logFormat string
}

// register adds the aggregator's flags; inServe leaves out those `serve` shares with the checker.
func (a *aggregatorFlags) register(fs *flagSet, inServe bool) {
	g := &a.cfg.Aggregator
	if !inServe {
		fs.StringVar(&a.cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL` of the decision stream")
		a.natsTLS.register(fs, "nats", "NATS")
		fs.StringVar(&a.cfg.NATSCredentials, "nats-creds", "", "NATS credentials `file` of the aggregator role (an nkey seed, or a user JWT .creds file; `quotaflow nats-auth` writes them); with it the rule store's buckets are bound, not created (the admin API's process creates them)")
		fs.IntVar(&g.Partitions, "partitions", stream.Partitions, "partitions of the decision stream; the checkers' --partitions")
		fs.IntVar(&g.Replicas, "stream-replicas", 1, "replicas of the aggregators' buckets and of the rule store and events stream when the aggregator creates them; the checkers' --stream-replicas")
		fs.StringVar(&a.cfg.Listen, "listen", "127.0.0.1:8081", "`address` serving /metrics, /healthz and /readyz")
		fs.StringVar(&g.InstanceID, "instance-id", "", "`name` of this aggregator among its peers, e.g. the pod name; a random suffix keeps each process start unique")
		fs.StringVar(&a.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
		fs.StringVar(&a.logFormat, "log-format", "text", "log `format`: text or json")
		fs.fromEnv("nats-url", "nats-creds", "partitions", "stream-replicas", "listen", "instance-id", "log-level", "log-format")
		registerHealthInterval(fs, &a.cfg.Health)
	}
	def := "clickhouse://127.0.0.1:9000/quotaflow"
	if inServe {
		def = "" // serve runs the aggregator only when a ClickHouse is named
	}
	a.ch.register(fs, def)
	fs.IntVar(&g.BatchRows, "batch-rows", 50000, "most decisions in one ClickHouse insert")
	fs.DurationVar(&g.FlushInterval, "flush-interval", time.Second, "longest a decision waits for its insert")
	fs.DurationVar(&g.InsertTimeout, "insert-timeout", 5*time.Second, "deadline of one insert; a failed insert is retried with backoff")
	fs.DurationVar(&g.PinnedTTL, "pinned-ttl", 10*time.Second, "fail-over time: how long a dead aggregator's partitions stay pinned to it (more than --insert-timeout)")
	fs.DurationVar(&g.AckWait, "ack-wait", 30*time.Second, "how long a fetched decision may stay unstored before it is redelivered: the fail-over time of a dead aggregator's fetched decisions (more than --flush-interval plus --insert-timeout)")
	fs.DurationVar(&g.RetentionInterval, "retention-interval", time.Hour, "how often expired partitions are dropped (decisions 90 days, usage_minute 30, usage_hour and usage_day 1 year)")
	fs.DurationVar(&g.WarningGrace, "warning-grace", time.Second, "how long after a warning timer's instant a subject with no traffic gets its recovery transition (decisions of that instant still in flight come first)")
	fs.DurationVar(&g.PolicyInterval, "policy-interval", time.Second, "how often the rules' policies (penalty, tier protection) are evaluated")
	fs.fromEnv("batch-rows", "flush-interval", "insert-timeout", "pinned-ttl", "ack-wait", "retention-interval",
		"warning-grace", "policy-interval")
}

// validate checks the flags and completes the config.
func (a *aggregatorFlags) validate() error {
	g := &a.cfg.Aggregator
	switch {
	case !isNATSURL(a.cfg.NATSURL):
		return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", a.cfg.NATSURL)
	case g.Partitions < 1 || g.Partitions > stream.MaxPartitions:
		return fmt.Errorf("--partitions: want 1 to %d, got %d", stream.MaxPartitions, g.Partitions)
	case g.Replicas < 1 || g.Replicas > 5:
		return fmt.Errorf("--stream-replicas: want 1 to 5, got %d", g.Replicas)
	case g.BatchRows < 1:
		return fmt.Errorf("--batch-rows: want at least 1, got %d", g.BatchRows)
	case g.FlushInterval < time.Millisecond:
		return fmt.Errorf("--flush-interval: want at least 1ms, got %s", g.FlushInterval)
	case g.InsertTimeout < 100*time.Millisecond:
		return fmt.Errorf("--insert-timeout: want at least 100ms, got %s", g.InsertTimeout)
	case g.PinnedTTL <= g.InsertTimeout:
		return fmt.Errorf("--pinned-ttl: want more than --insert-timeout (%s), got %s", g.InsertTimeout, g.PinnedTTL)
	case g.AckWait <= g.FlushInterval+g.InsertTimeout:
		return fmt.Errorf("--ack-wait: want more than --flush-interval plus --insert-timeout (%s), got %s", g.FlushInterval+g.InsertTimeout, g.AckWait)
	case g.RetentionInterval < time.Second:
		return fmt.Errorf("--retention-interval: want at least 1s, got %s", g.RetentionInterval)
	case g.PolicyInterval < 10*time.Millisecond || g.PolicyInterval > time.Hour:
		return fmt.Errorf("--policy-interval: want 10ms to 1h, got %s", g.PolicyInterval)
	case g.WarningGrace < 0 || g.WarningGrace > time.Minute:
		return fmt.Errorf("--warning-grace: want 0 to 1m, got %s", g.WarningGrace)
	case !validInstance(g.InstanceID):
		return fmt.Errorf("--instance-id: at most 64 letters, digits, '-' or '_', got %q", g.InstanceID)
	}
	if _, err := schema.ParseDSN(a.ch.dsn); err != nil {
		return fmt.Errorf("--clickhouse-dsn: %w", err)
	}
	if err := checkCreds("nats-creds", a.cfg.NATSCredentials); err != nil {
		return err
	}
	var err error
	if a.cfg.NATSTLS, err = a.natsTLS.config(""); err != nil {
		return err
	}
	a.cfg.ClickHouseDSN, g.Cluster = a.ch.dsn, a.ch.cluster
	a.cfg.ClickHouseTLS, err = a.ch.tls.config("")
	return err
}

func validInstance(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func runAggregator(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("aggregator", `Consumes the QUOTAFLOW_DECISIONS stream into ClickHouse: every decision into
quotaflow.decisions (kept 90 days) and, through materialized views, the usage rollups
usage_minute (30 days), usage_hour and usage_day (1 year). Applies the schema migrations at
start. Run several: they split the stream's partitions, one active consumer per partition,
and take over a dead one's partitions after --pinned-ttl. Every decision is stored exactly
once; while ClickHouse is down nothing is acked and JetStream keeps the backlog.
It also computes each subject's warning state per rule (normal, warning, throttled, with the
rule store's thresholds), publishes every transition on quotaflow.warnings.<tier>.<dimension>
(QUOTAFLOW_EVENTS) exactly once, and stores the events stream (transitions, override and
configuration changes) in state_transitions (90 days), overrides and config_changes (1 year).`, stderr)
	var a aggregatorFlags
	a.register(fs, false)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if err := a.validate(); err != nil {
		return usageError{err}
	}
	log, err := newLogger(a.logLevel, a.logFormat, stderr)
	if err != nil {
		return err
	}
	a.cfg.Logger = log
	d, err := daemon.StartAggregator(ctx, a.cfg)
	if err != nil {
		return flagErr(err)
	}
	return serveUntil(ctx, d)
}
