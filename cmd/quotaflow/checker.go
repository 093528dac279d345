package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/admin"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/rulestore"
	"github.com/quotaflow/quotaflow/internal/telemetry"
	"github.com/quotaflow/quotaflow/publisher"
)

// The checker's parts meet here: each implements an interface the package that uses it owns.
var (
	_ checker.DecisionSink = (*publisher.Client)(nil)
	_ admin.Store          = (*rulestore.Follower)(nil)
)

// checkerFlags are the checker's settings, shared by the commands that run one.
type checkerFlags struct {
	listen          string
	rulesPath       string
	redisTimeout    time.Duration
	shutdownTimeout time.Duration
	logLevel        string
	logFormat       string
	instanceID      string
	overLimitCache  bool
	otlpEndpoint    string
	traceRatio      float64
	debugListen     string
	admin           adminFlags
	callers         callerFlags
	tls             serverTLSFlags
	redis           redisFlags
	serving         servingFlags
	tlsConfig       *tls.Config // of tls, made by validate
}

func (c *checkerFlags) register(fs *flagSet) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` to serve the check API on")
	fs.StringVar(&c.rulesPath, "rules", "", "rules `file` (YAML); required without --nats-url. With --nats-url it seeds the rule store (NATS KV) when the store holds no rules yet, and is enforced while NATS is unreachable at start")
	fs.DurationVar(&c.redisTimeout, "redis-timeout", 50*time.Millisecond, "deadline of each check's Redis call; past it each rule's fail_mode decides")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long to let requests in flight finish on SIGTERM")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&c.instanceID, "instance-id", "", "`name` of this checker in decision ids and events, e.g. the pod name; a random suffix keeps each process start unique")
	fs.BoolVar(&c.overLimitCache, "over-limit-cache", true, "answer checks of buckets known to deny until a known instant without a Redis call (exact)")
	fs.StringVar(&c.otlpEndpoint, "otlp-endpoint", "", "OTLP/HTTP traces `URL`, e.g. http://collector:4318/v1/traces (empty: no traces)")
	fs.Float64Var(&c.traceRatio, "trace-sample-ratio", 0.01, "share of checks traced when --otlp-endpoint is set")
	fs.StringVar(&c.debugListen, "debug-listen", "", "`address` serving Go's /debug/pprof profiles (empty: off); keep it private")
	fs.fromEnv("listen", "rules", "redis-timeout", "shutdown-timeout", "log-level",
		"log-format", "instance-id", "over-limit-cache", "otlp-endpoint", "trace-sample-ratio",
		"debug-listen")
	c.admin.register(fs)
	c.callers.register(fs)
	c.tls.register(fs)
	c.redis.register(fs)
	c.serving.register(fs)
}

func (c *checkerFlags) logger(w io.Writer) (*slog.Logger, error) {
	return newLogger(c.logLevel, c.logFormat, w)
}

// newLogger returns the logger the --log-level and --log-format flags ask for.
func newLogger(levelName, format string, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format: want text or json, got %q", format)}
}

func runChecker(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("checker", `Serves quotaflow.v1.RateLimiter over Connect, gRPC and gRPC-Web (HTTP/1.1 and h2c), with gRPC
reflection and health, GET /ratelimit/check for gateways, /healthz and /readyz, all on one port.
Buckets live in Redis; the rules file is validated at start and any problem stops the start.
With --nats-url every decision is published to the QUOTAFLOW_DECISIONS stream (spooled on disk
while NATS is unreachable; on SIGTERM the queue and the spool are drained first), and the rules,
tiers, users and overrides come from the rule store in NATS KV (seeded from --rules when empty),
watched so that every change is enforced within a fraction of a second. The admin REST API under
/api/v1 (rules, tiers, overrides; bearer tokens from --admin-token or --admin-tokens-file)
writes to that store. Unless GOGC is set, the checker runs with GOGC=400.`, stderr)
	var c checkerFlags
	var p publishFlags
	c.register(fs)
	p.register(fs, "quotaflow-spool")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	log, err := c.validate(&p, stderr)
	if err != nil {
		return err
	}
	if pct, ok := checkerGCPercent(getenv); ok {
		debug.SetGCPercent(pct)
	}
	return serveChecker(ctx, &c, &p, log, nil)
}

// checkerGCPercent is the GC target the checker command sets: 400 unless GOGC is set. The
// checker's live heap is small and its garbage is per check, so collecting a quarter as often
// buys 5-8 % more checks/s for about 12 MB more peak memory (docs/performance.md).
func checkerGCPercent(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return 400, true
}

// validate checks the flags of a checker and returns its logger.
func (c *checkerFlags) validate(p *publishFlags, stderr io.Writer) (*slog.Logger, error) {
	if c.rulesPath == "" && p.natsURL == "" {
		return nil, usageError{errors.New("--rules (or QUOTAFLOW_RULES) is required without --nats-url (with it, the rule store is the source)")}
	}
	if strings.ContainsAny(c.instanceID, " .*>\t\r\n") || len(c.instanceID) > 64 {
		return nil, usageError{fmt.Errorf("--instance-id: at most 64 characters, without spaces, '.', '*' or '>', got %q", c.instanceID)}
	}
	if err := p.validate(); err != nil {
		return nil, usageError{err}
	}
	if c.traceRatio <= 0 || c.traceRatio > 1 {
		return nil, usageError{fmt.Errorf("--trace-sample-ratio: want more than 0 and at most 1, got %v", c.traceRatio)}
	}
	if err := c.admin.validate(); err != nil {
		return nil, usageError{err}
	}
	if err := c.serving.validate(); err != nil {
		return nil, usageError{err}
	}
	if err := c.callers.validate(c.admin.tokens); err != nil {
		return nil, usageError{err}
	}
	var err error
	if c.tlsConfig, err = c.tls.config(); err != nil {
		return nil, usageError{err}
	}
	return c.logger(stderr)
}

// processTelemetry is the telemetry of a process serving more than the checker (serve with an
// aggregator), shared so that one /metrics shows every component's instruments.
type processTelemetry struct {
	instanceID string
	tel        *telemetry.Telemetry
}

// newProcessTelemetry sets up the telemetry of a process of instance instanceID from the
// checker's flags; the caller closes it with closeTelemetry.
func (c *checkerFlags) newProcessTelemetry(ctx context.Context, instanceID string) (*processTelemetry, error) {
	tel, err := telemetry.Setup(ctx, telemetry.Config{Instance: instanceID, OTLPEndpoint: c.otlpEndpoint, SampleRatio: c.traceRatio})
	if err != nil {
		return nil, err
	}
	return &processTelemetry{instanceID: instanceID, tel: tel}, nil
}

// closeTelemetry flushes tel, bounded: its spans' exporter may be unreachable.
func closeTelemetry(tel *telemetry.Telemetry, log *slog.Logger) {
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tel.Close(sctx); err != nil {
		log.Warn("telemetry flush", "err", err)
	}
}

// serveChecker runs a checker, and its publisher and rule-store watch when p names NATS, until
// ctx is done; then it stops taking checks and drains the decisions. It reports on shared's
// telemetry (serve's, with the aggregator's instruments), or with shared nil on its own.
func serveChecker(ctx context.Context, c *checkerFlags, p *publishFlags, log *slog.Logger, shared *processTelemetry) error {
	var set *rules.Set
	var seed *rules.Document
	if c.rulesPath != "" {
		var err error
		if seed, set, err = rules.LoadFile(c.rulesPath); err != nil {
			return err
		}
	}
	rdb, redisDesc, err := c.redis.client(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if shared == nil {
		// Unique per process start even with a stable --instance-id (a pod name): decision ids
		// and message ids repeated after a restart would be dropped by the stream as duplicates.
		if shared, err = c.newProcessTelemetry(ctx, instance.Named(c.instanceID)); err != nil {
			return err
		}
		defer closeTelemetry(shared.tel, log)
	}
	instanceID, tel := shared.instanceID, shared.tel
	cfg := checker.Config{Redis: rdb, RedisTimeout: c.redisTimeout, Logger: log, InstanceID: instanceID,
		DisableOverLimitCache: !c.overLimitCache, Meter: tel.Meter, Tracer: tel.Tracer, TraceRatio: tel.TraceRatio}
	var (
		pub      *publisher.Client
		follower *rulestore.Follower
		store    admin.Store // nil: the admin API answers 503
	)
	sourceName := "file"
	if p.natsURL != "" {
		natsTLS, err := p.natsTLS.config("")
		if err != nil {
			return usageError{err}
		}
		nc, err := broker.Connect(p.natsURL, "quotaflow checker "+instanceID, natsTLS, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = broker.CheckReplicas(cctx, nc, p.replicas)
		cancel()
		if err != nil {
			return replicasFlag(err)
		}
		follower = rulestore.NewFollower(js, rulestore.FollowerConfig{
			Store: rulestore.Config{Replicas: p.replicas, Logger: log}, Seed: seed, SeedPath: c.rulesPath, Logger: log})
		store = follower
		// The store's rules, not the file's, are enforced from the first check: the file may be
		// older than changes made through the API.
		storeSet, err := follower.Open(ctx)
		// Without a rules file there is nothing to enforce until the store answers: wait for it
		// (a NATS cluster still electing its leaders, say) as long as the failure may pass.
		for set == nil && err != nil && broker.Transient(err) && !errors.Is(err, rules.ErrNotSeeded) && ctx.Err() == nil {
			log.Warn("rule store not reachable yet and no --rules file to enforce meanwhile: waiting", "err", err)
			storeSet, err = follower.Open(ctx)
		}
		switch {
		case err == nil:
			set, sourceName = storeSet, "store"
		case errors.Is(err, rules.ErrNotSeeded):
			return err
		case errors.As(err, new(*broker.ReplicasError)):
			return replicasFlag(err)
		case set == nil:
			return fmt.Errorf("rule store unreachable at start and no --rules file to enforce meanwhile: %w", err)
		default:
			log.Warn("rule store unreachable at start; enforcing the rules file and retrying in the background", "err", err)
		}
		pcfg := p.config(instanceID, log)
		pcfg.Meter = tel.Meter
		if pub, err = publisher.New(nc, pcfg); err != nil {
			return err
		}
		cfg.Decisions = pub
	} else {
		log.Warn("no --nats-url: decisions are not published, rules come from the file only and the admin API is off")
	}
	cfg.Rules = set
	engine := checker.New(cfg)
	defer engine.Close()
	// One failure budget per source address for both APIs: a token guessed at one is a token
	// guessed at the other.
	lockout := auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: c.admin.authFailures,
		TrustedProxies: c.callers.fa.TrustedProxies, Logger: log})
	front := transport.New(engine, transport.Config{Callers: c.callers.callers, ForwardAuth: c.callers.fa, TLS: c.tlsConfig,
		MaxRequestBytes: c.serving.maxRequestBytes, HideReflection: c.serving.hideReflection(c.callers.callersFile),
		Conns: c.serving.conns(), Lockout: lockout, Logger: log})
	mux := http.NewServeMux()
	var metricsLn net.Listener // --metrics-listen's, else /metrics is on the check port
	if c.serving.metricsListen != "" {
		if metricsLn, err = net.Listen("tcp", c.serving.metricsListen); err != nil {
			if pub != nil {
				err = errors.Join(err, closePublisher(pub, c.shutdownTimeout))
			}
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		defer metricsLn.Close() // on the way out before serving; served, it is closed already
	} else {
		mux.Handle("GET /metrics", tel.Metrics)
	}
	mux.Handle("/api/v1/", admin.New(engine, c.admin.config(store, lockout, log)).Handler())
	mux.Handle("/", front.Handler())
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		if pub != nil {
			err = errors.Join(err, closePublisher(pub, c.shutdownTimeout))
		}
		return fmt.Errorf("listen: %w", err)
	}
	scheme := "http://"
	if c.tlsConfig != nil {
		scheme = "https://"
	}
	log.Info("checker listening", "url", scheme+ln.Addr().String(), "rules", c.rulesPath, "rules_from", sourceName,
		"rule_count", len(set.Rules()), "redis", redisDesc, "nats", p.natsURL, "instance", instanceID,
		"admin_tokens", len(c.admin.tokens))
	if c.debugListen != "" {
		url, stop, err := telemetry.ServeProfiles(c.debugListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--debug-listen: %w", err)
		}
		defer stop()
		log.Info("profiles served", "url", url)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return front.Serve(gctx, ln, mux, c.shutdownTimeout)
	})
	if metricsLn != nil {
		log.Info("metrics served", "url", "http://"+metricsLn.Addr().String()+"/metrics")
		metrics := http.NewServeMux()
		metrics.Handle("GET /metrics", tel.Metrics)
		g.Go(func() error {
			if err := grpcsplit.ServeHTTP(gctx, metricsLn, metrics, c.shutdownTimeout, c.serving.conns()); err != nil {
				return fmt.Errorf("--metrics-listen: %w", err)
			}
			return nil
		})
	}
	if follower != nil {
		g.Go(func() error { return follower.Run(gctx, engine.SetRules) })
	}
	if c.callers.callersFile != "" {
		g.Go(func() error { c.callers.callers.Follow(gctx, c.callers.callersFile, 2*time.Second, log); return nil })
	}
	err = g.Wait()
	if pub != nil {
		// No check can run any more: every decision made is in the publisher.
		err = errors.Join(err, closePublisher(pub, c.shutdownTimeout))
	}
	return err
}
