package main

import (
	"context"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/stream"
)

type aggregatorFlags struct {
	cfg       daemon.AggregatorConfig
	natsTLS   clientTLSFlags
	ch        clickhouseFlags
	logLevel  string
	logFormat string
}

// register adds the aggregator's flags; inServe leaves out those `serve` shares with the checker.
func (a *aggregatorFlags) register(fs *cli.FlagSet, inServe bool) {
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
		fs.FromEnv("nats-url", "nats-creds", "partitions", "stream-replicas", "listen", "instance-id", "log-level", "log-format")
		registerHealthInterval(fs, &a.cfg.Health)
		registerWebhookPolicy(fs, &g.WebhookPolicy)
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
	fs.FromEnv("batch-rows", "flush-interval", "insert-timeout", "pinned-ttl", "ack-wait", "retention-interval",
		"warning-grace", "policy-interval")
}

// aggregatorFlagNames are the flags of daemon.AggregatorConfig's fields not spelled as the
// field (fieldFlagErr), or named in another field's error.
var aggregatorFlagNames = map[string]string{
	"NATSURL": "nats-url", "NATSCredentials": "nats-creds", "Aggregator.Replicas": "stream-replicas",
	"Aggregator.InsertTimeout": "insert-timeout", "Aggregator.FlushInterval": "flush-interval",
	"ClickHouseDSN": "clickhouse-dsn", "Health.Interval": "health-interval",
}

// validate completes the config from the flags and checks it.
func (a *aggregatorFlags) validate() error {
	a.cfg.ClickHouseDSN, a.cfg.Aggregator.Cluster = a.ch.dsn, a.ch.cluster
	if err := a.cfg.Validate(); err != nil {
		return cli.FlagError(err, aggregatorFlagNames)
	}
	var err error
	if a.cfg.NATSTLS, err = a.natsTLS.config(""); err != nil {
		return cli.Usage(err)
	}
	if a.cfg.ClickHouseTLS, err = a.ch.tls.config(""); err != nil {
		return cli.Usage(err)
	}
	return nil
}

func runAggregator(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("aggregator", help("aggregator"), stderr)
	var a aggregatorFlags
	a.register(fs, false)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if err := a.validate(); err != nil {
		return err
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
