package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/daemon"
	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/telemetry"
)

func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", `The all-in-one for development: a checker that publishes every decision, and, when no
--nats-url is given, an embedded NATS server with JetStream (real nats-server code) listening on
--nats-listen with its data in --nats-dir, so NATS clients (quotaflow watch, nats-sub) can
attach. With --clickhouse-dsn it also runs the aggregator, which stores every decision in
ClickHouse. The rules live in the rule store in that NATS (seeded from --rules on first start;
change them with quotaflow rules|override|tier and --admin-token). Ctrl-C stops taking checks,
drains the decisions to the stream, finishes the aggregator's insert in flight and stops NATS.`, stderr)
	var c checkerFlags
	var p publishFlags
	var a aggregatorFlags
	var natsListen, natsDir string
	c.register(fs)
	p.register(fs, ".dev/spool")
	a.register(fs, true)
	fs.StringVar(&natsListen, "nats-listen", "127.0.0.1:4222", "`address` of the embedded NATS server (used without --nats-url)")
	fs.StringVar(&natsDir, "nats-dir", ".dev/nats", "`folder` of the embedded NATS server's JetStream data")
	fs.fromEnv("nats-listen", "nats-dir")
	// Registered for the checker, where no NATS means no publishing; serve always publishes.
	fs.describe("nats-url", "NATS `URL` of an external server for the decision stream and the rule store; empty: serve starts an embedded NATS server (--nats-listen, --nats-dir) and publishes there")
	fs.describe("rules", "rules `file` (YAML) that seeds the rule store when it holds no rules yet, so required on the first start; with --nats-url it is also enforced while NATS is unreachable at start")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	embedded := p.natsURL == ""
	if embedded {
		p.natsURL = "nats://" + natsListen // validated below; replaced by the server's own URL
	}
	log, err := c.validate(&p, stderr)
	if err != nil {
		return err
	}
	if embedded {
		if err := os.MkdirAll(natsDir, 0o755); err != nil {
			return fmt.Errorf("--nats-dir: %w", err)
		}
		ns, err := broker.Embedded("quotaflow-dev", natsListen, natsDir)
		if err != nil {
			return fmt.Errorf("--nats-listen: %w", err)
		}
		url := ns.ClientURL()
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		p.natsURL = url
		log.Info("embedded NATS listening", "url", url, "jetstream_dir", natsDir)
	}
	if a.ch.dsn == "" {
		d, err := c.start(ctx, &p, log)
		if err != nil {
			return err
		}
		return serveUntil(ctx, d)
	}
	a.cfg.NATSURL, a.natsTLS, a.cfg.Aggregator.Partitions = p.natsURL, p.natsTLS, p.cfg.Partitions
	a.cfg.Aggregator.Replicas, a.cfg.Aggregator.InstanceID = p.cfg.Replicas, c.cfg.InstanceID
	a.cfg.Health = c.cfg.Health
	if err := a.validate(); err != nil {
		return usageError{err}
	}
	return serveWithAggregator(ctx, &c, &p, &a, log)
}

// serveWithAggregator runs the checker and an aggregator in one process, with one telemetry:
// the checker's /metrics serves the aggregator's instruments (quotaflow_aggregator_*) too.
// Either failing stops both.
func serveWithAggregator(ctx context.Context, c *checkerFlags, p *publishFlags, a *aggregatorFlags, log *slog.Logger) error {
	c.cfg.Tracing.Instance = instance.Named(c.cfg.InstanceID)
	tel, err := telemetry.Setup(ctx, c.cfg.Tracing)
	if err != nil {
		return err
	}
	defer daemon.CloseTelemetry(tel)
	a.cfg.Telemetry, a.cfg.Logger, c.cfg.Telemetry = tel, log, tel
	if c.cfg.AuditClickHouseDSN == "" {
		// The admin API's backtests read the audit this aggregator writes.
		c.cfg.AuditClickHouseDSN, c.cfg.AuditClickHouseTLS = a.cfg.ClickHouseDSN, a.cfg.ClickHouseTLS
	}
	agg, err := daemon.StartAggregator(ctx, a.cfg)
	if err != nil {
		return flagErr(err)
	}
	chk, err := c.start(ctx, p, log)
	if err != nil {
		return errors.Join(err, agg.Close())
	}
	select {
	case <-ctx.Done():
	case <-agg.Done():
	case <-chk.Done():
	}
	// The checker first: its last decisions drain to the stream while the aggregator still runs.
	return errors.Join(chk.Close(), agg.Close())
}
