package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/telemetry"
	"github.com/quotaflow/quotaflow/schema"
)

// The aggregator owns the interface it depends on; the rule store must keep satisfying it.
var _ aggregator.RuleStore = (*rulestore.Store)(nil)

// AggregatorConfig configures an aggregator. The zero value is usable: NATS on
// 127.0.0.1:4222, ClickHouse on 127.0.0.1:9000, database quotaflow, no port of its own.
type AggregatorConfig struct {
	// NATSURL is the NATS of the decision stream ("" means nats://127.0.0.1:4222), NATSTLS its
	// client TLS.
	NATSURL string
	NATSTLS *tls.Config
	// NATSCredentials authenticates the aggregator to NATS (broker.Client.Credentials): the
	// aggregator role's (package natsauth). With them the rule store's buckets are bound, not
	// created: the admin API's process creates them.
	NATSCredentials string
	// ClickHouseDSN names the server and database ("" means
	// clickhouse://127.0.0.1:9000/quotaflow), ClickHouseTLS its client TLS.
	ClickHouseDSN string
	ClickHouseTLS *tls.Config
	// Aggregator configures the aggregator; Database, RuleStore, Logger and Meter are set
	// here, and its InstanceID ("aggregator" when empty) gets a random suffix: a restarted
	// aggregator is a new member.
	Aggregator aggregator.Config
	// Listen, when set, serves /metrics, /healthz and /readyz (ready while NATS is connected).
	Listen string
	// Telemetry, when set, is shared with other daemons of the process (serve: the checker's
	// /metrics shows the aggregator's instruments) and left open; nil means one of its own.
	Telemetry *telemetry.Telemetry
	// Health configures the aggregator's health reports into NATS (quotaflow status): on
	// unless Health.Interval is negative.
	Health health.Config
	// Logger receives the aggregator's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Aggregator is a running aggregator.
type Aggregator struct {
	*process
	url string
}

// URL is the base URL of the metrics and health port ("" without AggregatorConfig.Listen).
func (a *Aggregator) URL() string { return a.url }

// StartAggregator connects ClickHouse and NATS, opens the rule store (waiting, logging, for a
// NATS cluster still electing its leaders, until ctx ends), applies the schema migrations and
// runs the aggregator until Close. On any failure everything acquired is released; a bad DSN
// wraps a *schema.DSNError, too few NATS servers for the replicas a *broker.ReplicasError.
func StartAggregator(ctx context.Context, cfg AggregatorConfig) (_ *Aggregator, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = "nats://127.0.0.1:4222"
	}
	if cfg.ClickHouseDSN == "" {
		cfg.ClickHouseDSN = "clickhouse://127.0.0.1:9000/" + schema.DefaultDatabase
	}
	log := cfg.Logger
	a := &Aggregator{process: newProcess(log)}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	tel := cfg.Telemetry
	if tel == nil {
		if tel, err = telemetry.Setup(ctx, telemetry.Config{Instance: cfg.Aggregator.InstanceID}); err != nil {
			return nil, err
		}
		a.onClose(func() error { return CloseTelemetry(tel) })
	}
	conn, db, err := schema.Open(cfg.ClickHouseDSN, cfg.ClickHouseTLS)
	if err != nil {
		return nil, err
	}
	a.onClose(conn.Close)
	nc, err := broker.Connect(broker.Client{URL: cfg.NATSURL, Name: "quotaflow aggregator", TLS: cfg.NATSTLS, Credentials: cfg.NATSCredentials}, log)
	if err != nil {
		return nil, err
	}
	a.onClose(func() error { nc.Close(); return nil })
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	acfg := cfg.Aggregator
	acfg.Replicas = max(1, acfg.Replicas)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = broker.CheckReplicas(cctx, nc, acfg.Replicas)
	cancel()
	if err != nil {
		return nil, err
	}
	// Waits for NATS (a cluster still electing its leaders, say), logging, until ctx ends.
	// With credentials, the aggregator's role may not create the configuration bucket: the
	// admin API's process does, and the aggregator waits for it.
	store, err := rulestore.Open(ctx, js, rulestore.Config{Replicas: acfg.Replicas, Bind: cfg.NATSCredentials != "", Logger: log})
	if err != nil {
		return nil, err
	}
	if acfg.InstanceID == "" {
		acfg.InstanceID = "aggregator"
	}
	acfg.InstanceID = instance.Named(acfg.InstanceID)
	acfg.Database, acfg.RuleStore, acfg.Logger, acfg.Meter = db, store, log, tel.Meter
	acfg.Webhooks = rulestore.NewWebhooks(js, rulestore.Config{Bind: true, Logger: log})
	agg, err := aggregator.New(js, conn, acfg)
	if err != nil {
		return nil, err
	}
	log.Info("aggregator starting", "instance", agg.InstanceID(), "nats", cfg.NATSURL,
		"clickhouse", schema.RedactDSN(cfg.ClickHouseDSN), "database", db)
	if cfg.Listen != "" {
		if err := a.serveHealth(cfg.Listen, tel, nc); err != nil {
			return nil, err
		}
	}
	if !cfg.Health.Disabled() {
		hcfg := cfg.Health
		hcfg.Replicas, hcfg.Logger = acfg.Replicas, log
		rep := health.Start(js, &health.Aggregator{Aggregator: agg, ClickHouse: conn, NATS: nc}, hcfg)
		a.onClose(rep.Close)
	}
	a.goServe(agg.Run)
	a.started()
	return a, nil
}

// serveHealth serves the aggregator's metrics and health on addr.
func (a *Aggregator) serveHealth(addr string, tel *telemetry.Telemetry, nc *nats.Conn) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	a.url = "http://" + ln.Addr().String()
	a.log.Info("aggregator serving metrics", "url", a.url+"/metrics")
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.Metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !nc.IsConnected() {
			http.Error(w, "nats not connected", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	a.goServe(func(ctx context.Context) error {
		return grpcsplit.ServeHTTP(ctx, ln, mux, 5*time.Second, grpcsplit.Config{})
	})
	return nil
}
