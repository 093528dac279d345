package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/daemon"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/schema"
)

type aggregatorFlags struct {
	natsURL           string
	natsTLS           clientTLSFlags
	ch                clickhouseFlags
	listen            string
	partitions        int
	replicas          int
	batchRows         int
	flushInterval     time.Duration
	insertTimeout     time.Duration
	pinnedTTL         time.Duration
	ackWait           time.Duration
	retentionInterval time.Duration
	warningGrace      time.Duration
	policyInterval    time.Duration
	instanceID        string
	logLevel          string
	logFormat         string
}

// register adds the aggregator's flags; inServe leaves out those `serve` shares with the checker.
func (a *aggregatorFlags) register(fs *flagSet, inServe bool) {
	if !inServe {
		fs.StringVar(&a.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL` of the decision stream")
		a.natsTLS.register(fs, "nats", "NATS")
		fs.IntVar(&a.partitions, "partitions", stream.Partitions, "partitions of the decision stream; the checkers' --partitions")
		fs.IntVar(&a.replicas, "stream-replicas", 1, "replicas of the aggregators' buckets and of the rule store and events stream when the aggregator creates them; the checkers' --stream-replicas")
		fs.StringVar(&a.listen, "listen", "127.0.0.1:8081", "`address` serving /metrics, /healthz and /readyz")
		fs.StringVar(&a.instanceID, "instance-id", "", "`name` of this aggregator among its peers, e.g. the pod name; a random suffix keeps each process start unique")
		fs.StringVar(&a.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
		fs.StringVar(&a.logFormat, "log-format", "text", "log `format`: text or json")
		fs.fromEnv("nats-url", "partitions", "stream-replicas", "listen", "instance-id", "log-level", "log-format")
	}
	def := "clickhouse://127.0.0.1:9000/quotaflow"
	if inServe {
		def = "" // serve runs the aggregator only when a ClickHouse is named
	}
	a.ch.register(fs, def)
	fs.IntVar(&a.batchRows, "batch-rows", 50000, "most decisions in one ClickHouse insert")
	fs.DurationVar(&a.flushInterval, "flush-interval", time.Second, "longest a decision waits for its insert")
	fs.DurationVar(&a.insertTimeout, "insert-timeout", 5*time.Second, "deadline of one insert; a failed insert is retried with backoff")
	fs.DurationVar(&a.pinnedTTL, "pinned-ttl", 10*time.Second, "fail-over time: how long a dead aggregator's partitions stay pinned to it (more than --insert-timeout)")
	fs.DurationVar(&a.ackWait, "ack-wait", 30*time.Second, "how long a fetched decision may stay unstored before it is redelivered: the fail-over time of a dead aggregator's fetched decisions (more than --flush-interval plus --insert-timeout)")
	fs.DurationVar(&a.retentionInterval, "retention-interval", time.Hour, "how often expired partitions are dropped (decisions 90 days, usage_minute 30, usage_hour and usage_day 1 year)")
	fs.DurationVar(&a.warningGrace, "warning-grace", time.Second, "how long after a warning timer's instant a subject with no traffic gets its recovery transition (decisions of that instant still in flight come first)")
	fs.DurationVar(&a.policyInterval, "policy-interval", time.Second, "how often the rules' policies (penalty, tier protection) are evaluated")
	fs.fromEnv("batch-rows", "flush-interval", "insert-timeout", "pinned-ttl", "ack-wait", "retention-interval",
		"warning-grace", "policy-interval")
}

func (a *aggregatorFlags) validate() error {
	switch {
	case !strings.HasPrefix(a.natsURL, "nats://") && !strings.HasPrefix(a.natsURL, "tls://"):
		return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", a.natsURL)
	case a.partitions < 1 || a.partitions > stream.MaxPartitions:
		return fmt.Errorf("--partitions: want 1 to %d, got %d", stream.MaxPartitions, a.partitions)
	case a.replicas < 1 || a.replicas > 5:
		return fmt.Errorf("--stream-replicas: want 1 to 5, got %d", a.replicas)
	case a.batchRows < 1:
		return fmt.Errorf("--batch-rows: want at least 1, got %d", a.batchRows)
	case a.flushInterval < time.Millisecond:
		return fmt.Errorf("--flush-interval: want at least 1ms, got %s", a.flushInterval)
	case a.insertTimeout < 100*time.Millisecond:
		return fmt.Errorf("--insert-timeout: want at least 100ms, got %s", a.insertTimeout)
	case a.pinnedTTL <= a.insertTimeout:
		return fmt.Errorf("--pinned-ttl: want more than --insert-timeout (%s), got %s", a.insertTimeout, a.pinnedTTL)
	case a.ackWait <= a.flushInterval+a.insertTimeout:
		return fmt.Errorf("--ack-wait: want more than --flush-interval plus --insert-timeout (%s), got %s", a.flushInterval+a.insertTimeout, a.ackWait)
	case a.retentionInterval < time.Second:
		return fmt.Errorf("--retention-interval: want at least 1s, got %s", a.retentionInterval)
	case a.policyInterval < 10*time.Millisecond || a.policyInterval > time.Hour:
		return fmt.Errorf("--policy-interval: want 10ms to 1h, got %s", a.policyInterval)
	case a.warningGrace < 0 || a.warningGrace > time.Minute:
		return fmt.Errorf("--warning-grace: want 0 to 1m, got %s", a.warningGrace)
	case !validInstance(a.instanceID):
		return fmt.Errorf("--instance-id: at most 64 letters, digits, '-' or '_', got %q", a.instanceID)
	}
	if _, err := schema.ParseDSN(a.ch.dsn); err != nil {
		return fmt.Errorf("--clickhouse-dsn: %w", err)
	}
	return nil
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

// config is the aggregator's config the flags name; validate first.
func (a *aggregatorFlags) config(log *slog.Logger) (daemon.AggregatorConfig, error) {
	natsTLS, err := a.natsTLS.config("")
	if err != nil {
		return daemon.AggregatorConfig{}, usageError{err}
	}
	chTLS, err := a.ch.tls.config("")
	if err != nil {
		return daemon.AggregatorConfig{}, usageError{err}
	}
	return daemon.AggregatorConfig{NATSURL: a.natsURL, NATSTLS: natsTLS, ClickHouseDSN: a.ch.dsn, ClickHouseTLS: chTLS,
		Listen: a.listen, Logger: log, Aggregator: aggregator.Config{
			Partitions: a.partitions, Replicas: a.replicas, InstanceID: a.instanceID, BatchRows: a.batchRows,
			FlushInterval: a.flushInterval, InsertTimeout: a.insertTimeout, PinnedTTL: a.pinnedTTL, AckWait: a.ackWait,
			RetentionInterval: a.retentionInterval, WarningGrace: a.warningGrace, PolicyInterval: a.policyInterval,
			Cluster: a.ch.cluster,
		}}, nil
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
	cfg, err := a.config(log)
	if err != nil {
		return err
	}
	d, err := daemon.StartAggregator(ctx, cfg)
	if err != nil {
		return flagErr(err)
	}
	return serveUntil(ctx, d)
}
