package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/console"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/app/backtest"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/telemetry"
	"github.com/quotaflow/quotaflow/publisher"
	"github.com/quotaflow/quotaflow/schema"
)

// The checker's parts meet here: each implements an interface the package that uses it owns.
var (
	_ checker.DurableSink = (*publisher.Client)(nil)
	_ admin.RuleStore     = (*rulestore.Follower)(nil)
)

// CheckerConfig configures a checker. The zero value is usable: a checker on 127.0.0.1:8080
// over the Redis on 127.0.0.1:6379, once RulesFile or NATS names its rules.
type CheckerConfig struct {
	// Listen is the check port's address; "" means 127.0.0.1:8080, port 0 a free port
	// (Checker.URL says which).
	Listen string
	// RulesFile is a rules file (YAML), validated at start. Without NATS it is the rules;
	// with NATS it seeds the rule store when the store holds no rules yet, and is enforced
	// while NATS is unreachable at start.
	RulesFile string
	// Redis is the client of the buckets' Redis; nil means one for 127.0.0.1:6379. The
	// checker owns it: Close closes it, as does StartChecker when it fails.
	Redis redis.UniversalClient
	// RedisTimeout, ShutdownTimeout: the deadline of a check's Redis call (checker.Config's
	// default when 0) and how long requests in flight may finish at Close (10s when 0).
	RedisTimeout, ShutdownTimeout time.Duration
	// MaxInFlight bounds the checks waiting for Redis at once; past it checks are answered by
	// their rules' fail modes (checker.Config's: 0 means checker.DefaultMaxInFlight, negative
	// no bound).
	MaxInFlight int
	// BucketLayout is how the buckets are written in Redis, and SharedHashes the hashes per
	// cluster slot of bucket.LayoutShared (checker.Config).
	BucketLayout bucket.Layout
	SharedHashes int
	// InstanceID names the checker in decision ids and events, e.g. the pod name; a random
	// suffix keeps each start unique (decision ids repeated after a restart would be dropped by
	// the stream as duplicates).
	InstanceID string
	// DisableOverLimitCache: every check goes to Redis (checker.Config).
	DisableOverLimitCache bool
	// JournalGrace is how long a balance burn's decision may take to become durable before
	// the journal's sweeper publishes it again (checker.Config.JournalGrace); 0: the default.
	JournalGrace time.Duration
	// Telemetry, when set, is shared with other daemons of the process and left open; nil
	// means one of the checker's own, from Tracing.
	Telemetry *telemetry.Telemetry
	Tracing   telemetry.Config
	// DebugListen serves Go's /debug/pprof there ("" : off); MetricsListen serves /metrics
	// on a port of its own ("": on the check port); AdminListen serves the admin API and the
	// console on a port of their own ("": on the check port), so that the check port can
	// face callers alone.
	DebugListen, MetricsListen, AdminListen string
	// NATSURL names the NATS of the decision stream and the rule store, NATSTLS its client
	// TLS; "" means no publishing, rules from RulesFile only and an admin API answering 503.
	NATSURL string
	NATSTLS *tls.Config
	// NATSCredentials authenticates the checker to NATS (broker.Client.Credentials): the
	// checker role's, which publishes decisions and health and reads the rule store.
	// NATSAdminCredentials, when set, are the admin role's: the admin API writes the rule
	// store through a connection of their own, and an empty store is seeded by it. With
	// NATSCredentials and without NATSAdminCredentials the rule store is read-only here: the
	// admin API's writes answer 503, and an empty store is not seeded (the rules file is
	// enforced meanwhile). Without either, one connection does all (a NATS without users).
	NATSCredentials, NATSAdminCredentials string
	// AuditClickHouseDSN names the ClickHouse whose decision audit and usage rollups the
	// admin API reads for backtests (POST /api/v1/rules:backtest) and the console's usage
	// and subject views, AuditClickHouseTLS its client TLS; "" answers them 503. The server
	// is reached when one of them is asked, never at start.
	AuditClickHouseDSN string
	AuditClickHouseTLS *tls.Config
	// Publisher configures the decision stream; its Replicas is also the rule store's.
	// InstanceID, Logger and Meter are set by the checker.
	Publisher publisher.Config
	// Admin configures the admin API under /api/v1; Store, Lockout and Logger are set by the
	// checker.
	Admin admin.Config
	// Transport configures the check port; Lockout and Logger are set by the checker.
	// Transport.Callers (nil: none) is reloaded from CallersFile when it is set, and holds the
	// admin API's write tokens as admin callers.
	Transport   transport.Config
	CallersFile string
	// Health configures the checker's health reports into NATS (quotaflow status); with
	// NATSURL set they are on unless Health.Interval is negative.
	Health health.Config
	// IDKeys sign reservation and lease ids (checker.Config.IDKeys).
	IDKeys [][]byte
	// Logger receives every component's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Checker is a running checker.
type Checker struct {
	*process
	url, adminURL string
}

// URL is the check port's base URL, e.g. http://127.0.0.1:8080.
func (c *Checker) URL() string { return c.url }

// AdminURL is the base URL of the admin API and the console: the check port's, or
// CheckerConfig.AdminListen's.
func (c *Checker) AdminURL() string { return c.adminURL }

// StartChecker loads the rules, connects NATS and waits for the rule store as start-up policy
// says, builds the publisher, the engine and the transports, listens and serves until Close.
// ctx bounds the start only. On any failure everything acquired is released, the Redis client
// included, and the error says what failed; an error of a NATS server holding fewer than the
// asked replicas wraps a *broker.ReplicasError.
func StartChecker(ctx context.Context, cfg CheckerConfig) (_ *Checker, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Redis == nil {
		cfg.Redis = redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8080"
	}
	c := &Checker{process: newProcess(cfg.Logger)}
	c.onClose(cfg.Redis.Close)
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	tel := cfg.Telemetry
	if tel == nil {
		cfg.Tracing.Instance = instance.Named(cfg.InstanceID)
		if tel, err = telemetry.Setup(ctx, cfg.Tracing); err != nil {
			return nil, err
		}
		c.onClose(func() error { return CloseTelemetry(tel) })
	}
	s := &checkerStart{cfg: &cfg, c: c, tel: tel, log: cfg.Logger}
	if err := s.rules(ctx); err != nil {
		return nil, err
	}
	if err := s.serve(); err != nil {
		return nil, err
	}
	c.started()
	return c, nil
}

// checkerStart holds what StartChecker has built so far.
type checkerStart struct {
	cfg      *CheckerConfig
	c        *Checker
	tel      *telemetry.Telemetry
	log      *slog.Logger
	set      *rules.Set
	source   string // "file" or "store", for the log
	follower *rulestore.Follower
	webhooks *rulestore.Webhooks // nil without an admin API's NATS
	pub      *publisher.Client
	nc       *nats.Conn          // nil without NATS
	js       jetstream.JetStream // nil without NATS
}

// rules loads the rules file and, with NATS, connects, opens the rule store and the publisher.
func (s *checkerStart) rules(ctx context.Context) error {
	var seed *rules.Document
	if s.cfg.RulesFile != "" {
		var err error
		if seed, s.set, err = rules.LoadFile(s.cfg.RulesFile); err != nil {
			return err
		}
		s.source = "file"
	}
	if s.cfg.NATSURL == "" {
		if s.set == nil {
			return errors.New("no rules: name a rules file, or NATS for the rule store")
		}
		s.log.Warn("no NATS: decisions are not published, rules come from the file only and the admin API is off")
		return nil
	}
	nc, err := s.connect("quotaflow checker "+s.tel.Instance, s.cfg.NATSCredentials)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	s.nc, s.js = nc, js
	replicas := max(1, s.cfg.Publisher.Replicas)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = broker.CheckReplicas(cctx, nc, replicas)
	cancel()
	if err != nil {
		return err
	}
	fcfg := rulestore.FollowerConfig{Store: rulestore.Config{Replicas: replicas, Logger: s.log},
		Seed: seed, SeedPath: s.cfg.RulesFile, Logger: s.log}
	storeJS := js
	switch {
	case s.cfg.NATSAdminCredentials != "":
		anc, err := s.connect("quotaflow admin "+s.tel.Instance, s.cfg.NATSAdminCredentials)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		if storeJS, err = jetstream.New(anc); err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
	case s.cfg.NATSCredentials != "":
		fcfg.ReadOnly = true
	}
	s.follower = rulestore.NewFollower(storeJS, fcfg)
	if err := s.openStore(ctx); err != nil {
		return err
	}
	if !fcfg.ReadOnly {
		// The admin API sets the webhook endpoints (a read-only checker has none), their
		// bucket made by the first call: checks are served whether NATS answers or not.
		s.webhooks = rulestore.NewWebhooks(storeJS, rulestore.Config{Replicas: replicas, Logger: s.log})
	}
	return s.publisher(nc)
}

// connect connects to the checker's NATS with creds, closed with the checker.
func (s *checkerStart) connect(name, creds string) (*nats.Conn, error) {
	nc, err := broker.Connect(broker.Client{URL: s.cfg.NATSURL, Name: name, TLS: s.cfg.NATSTLS, Credentials: creds}, s.log)
	if err != nil {
		return nil, err
	}
	s.c.onClose(func() error { nc.Close(); return nil })
	return nc, nil
}

// openStore enforces the store's rules, not the file's, from the first check: the file may be
// older than changes made through the API. Without a rules file there is nothing to enforce
// until the store answers, so it waits (a NATS cluster still electing its leaders) as long as
// the failure may pass; with one, the file stands in and the follower retries.
func (s *checkerStart) openStore(ctx context.Context) error {
	set, err := s.follower.Open(ctx)
	for s.set == nil && err != nil && broker.Transient(err) && !errors.Is(err, rules.ErrNotSeeded) && ctx.Err() == nil {
		s.log.Warn("rule store not reachable yet and no rules file to enforce meanwhile: waiting", "err", err)
		set, err = s.follower.Open(ctx)
	}
	switch {
	case err == nil:
		s.set, s.source = set, "store"
		return nil
	case errors.Is(err, rules.ErrNotSeeded) && s.cfg.NATSAdminCredentials == "" && s.cfg.NATSCredentials != "" && s.set != nil:
		s.log.Warn("the rule store holds no rules and this checker may not seed it (no admin NATS credentials); enforcing the rules file until the admin API's process does")
		return nil
	case errors.Is(err, rules.ErrNotSeeded), errors.As(err, new(*broker.ReplicasError)):
		return err
	case s.set == nil:
		return fmt.Errorf("rule store unreachable at start and no rules file to enforce meanwhile: %w", err)
	}
	s.log.Warn("rule store unreachable at start; enforcing the rules file and retrying in the background", "err", err)
	return nil
}

// publisher starts the decision stream's client; Close drains it once no check can run.
func (s *checkerStart) publisher(nc *nats.Conn) error {
	pcfg := s.cfg.Publisher
	pcfg.InstanceID, pcfg.Logger, pcfg.Meter = s.tel.Instance, s.log, s.tel.Meter
	pub, err := publisher.New(nc, pcfg)
	if err != nil {
		return err
	}
	s.pub = pub
	s.c.onClose(func() error { return drain(pub, s.cfg.ShutdownTimeout) })
	return nil
}

// drain closes the publisher within timeout: the queue and the spool go to NATS; what cannot
// stays in the spool for the next start.
func drain(pub *publisher.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := pub.Close(ctx); err != nil {
		return fmt.Errorf("drain decisions: %w", err)
	}
	return nil
}

// serve builds the engine and the ports and starts serving them.
func (s *checkerStart) serve() error {
	cfg, log, tel := s.cfg, s.log, s.tel
	engine := s.engine()
	lockout := auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: cfg.Admin.AuthFailuresPerMinute,
		TrustedProxies: cfg.Transport.ForwardAuth.TrustedProxies, Logger: log})
	front, tcfg := s.front(engine, lockout)
	acfg, err := s.adminConfig(lockout)
	if err != nil {
		return err
	}
	mux, adminMux, err := s.muxes(engine, front, acfg)
	if err != nil {
		return err
	}
	if err := s.listen(front, mux, adminMux); err != nil {
		return err
	}
	log.Info("checker listening", "url", s.c.url, "rules", cfg.RulesFile, "rules_from", s.source,
		"rule_count", len(s.set.Rules()), "redis", redisName(cfg.Redis), "nats", cfg.NATSURL, "instance", tel.Instance,
		"admin_tokens", len(cfg.Admin.Tokens))
	if cfg.DebugListen != "" {
		url, stop, err := telemetry.ServeProfiles(cfg.DebugListen)
		if err != nil {
			return fmt.Errorf("debug listen: %w", err)
		}
		s.c.onClose(func() error { stop(); return nil })
		log.Info("profiles served", "url", url)
	}
	if s.follower != nil {
		s.c.goServe(func(ctx context.Context) error { return s.follower.Run(ctx, engine.SetRules) })
	}
	if cfg.CallersFile != "" {
		s.c.goServe(func(ctx context.Context) error {
			tcfg.Callers.Follow(ctx, cfg.CallersFile, 2*time.Second, log)
			return nil
		})
	}
	return nil
}

// engine builds the decision engine, publishing to the decision stream when there is one, and
// its health reports.
func (s *checkerStart) engine() *checker.Engine {
	cfg, tel := s.cfg, s.tel
	ecfg := checker.Config{Redis: cfg.Redis, RedisTimeout: cfg.RedisTimeout, MaxInFlight: cfg.MaxInFlight, BucketLayout: cfg.BucketLayout, SharedHashes: cfg.SharedHashes, Logger: s.log, InstanceID: tel.Instance,
		DisableOverLimitCache: cfg.DisableOverLimitCache, Meter: tel.Meter, Tracer: tel.Tracer, TraceRatio: tel.TraceRatio,
		Rules: s.set, IDKeys: cfg.IDKeys, Caller: transport.CallerName, JournalGrace: cfg.JournalGrace}
	if s.pub != nil {
		ecfg.Decisions = s.pub
	}
	engine := checker.New(ecfg)
	s.c.onClose(engine.Close)
	if s.nc != nil && !cfg.Health.Disabled() {
		hcfg := cfg.Health
		hcfg.Replicas, hcfg.Logger = max(1, cfg.Publisher.Replicas), s.log
		rep := health.Start(s.js, &health.Checker{Engine: engine, NATS: s.nc}, hcfg)
		s.c.onClose(rep.Close)
	}
	return engine
}

// front builds the check API's transports. lockout is one failure budget per source address
// for both APIs: a token guessed at one is a token guessed at the other.
func (s *checkerStart) front(engine *checker.Engine, lockout *auth.Lockout) (*transport.Server, transport.Config) {
	tcfg := s.cfg.Transport
	tcfg.Lockout, tcfg.Logger = lockout, s.log
	if tcfg.Callers == nil {
		tcfg.Callers = new(auth.Registry)
	}
	// The admin API's write tokens are admin callers of the check API too: reset is
	// authenticated as the admin API is.
	writers := map[string]string{}
	for tok, who := range s.cfg.Admin.Tokens {
		if who.Role == admin.RoleWrite {
			writers[tok] = who.Name
		}
	}
	tcfg.Callers.SetAdminTokens(writers)
	return transport.New(engine, tcfg), tcfg
}

// adminConfig is the admin API's configuration: the rule store it writes (none: it answers
// 503), and the backtests and audit reads of ClickHouse when configured.
func (s *checkerStart) adminConfig(lockout *auth.Lockout) (admin.Config, error) {
	cfg := s.cfg
	acfg := cfg.Admin
	acfg.Lockout, acfg.Logger = lockout, s.log
	if s.follower != nil {
		acfg.RuleStore, acfg.JetStream = s.follower, s.js
	}
	if s.webhooks != nil {
		acfg.Webhooks = s.webhooks
	}
	if cfg.AuditClickHouseDSN == "" {
		return acfg, nil
	}
	conn, db, err := schema.Open(cfg.AuditClickHouseDSN, cfg.AuditClickHouseTLS)
	if err != nil {
		return acfg, fmt.Errorf("backtest clickhouse: %w", err)
	}
	s.c.onClose(conn.Close)
	bcfg := backtest.InChecker
	bcfg.Conn, bcfg.Database, bcfg.Logger = conn, db, s.log
	acfg.Backtester = backtest.New(bcfg)
	if acfg.Audit, err = audit.New(audit.Config{Conn: conn, Database: db}); err != nil {
		return acfg, fmt.Errorf("backtest clickhouse: %w", err)
	}
	return acfg, nil
}

// muxes routes the check port (the check API, and /metrics unless it has its own port) and the
// admin port (the admin API and the console: the check port too unless AdminListen is set).
func (s *checkerStart) muxes(engine *checker.Engine, front *transport.Server, acfg admin.Config) (mux, adminMux *http.ServeMux, err error) {
	mux = http.NewServeMux()
	if s.cfg.MetricsListen == "" {
		mux.Handle("GET /metrics", s.tel.Metrics)
	} else if err := s.serveMetrics(); err != nil {
		return nil, nil, err
	}
	adminMux = mux
	if s.cfg.AdminListen != "" {
		adminMux = http.NewServeMux()
	}
	adminMux.Handle("/api/v1/", admin.New(engine, acfg).Handler())
	pages := console.Handler()
	adminMux.Handle(console.Path, pages)
	adminMux.Handle(strings.TrimSuffix(console.Path, "/"), pages)
	mux.Handle("/", front.Handler())
	return mux, adminMux, nil
}

// listen opens the check port (and the admin port when it has its own) and serves them.
func (s *checkerStart) listen(front *transport.Server, mux, adminMux *http.ServeMux) error {
	cfg := s.cfg
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	scheme := "http://"
	if cfg.Transport.TLS != nil {
		scheme = "https://"
	}
	s.c.url, s.c.adminURL = scheme+ln.Addr().String(), scheme+ln.Addr().String()
	if cfg.AdminListen != "" {
		if err := s.serveAdmin(adminMux, scheme); err != nil {
			ln.Close()
			return err
		}
	}
	s.c.goServe(func(ctx context.Context) error { return front.Serve(ctx, ln, mux, cfg.ShutdownTimeout) })
	return nil
}

// serveAdmin serves the admin API and the console alone on AdminListen, with the check port's
// TLS and connection bounds: no check API there.
func (s *checkerStart) serveAdmin(mux *http.ServeMux, scheme string) error {
	ln, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("admin listen: %w", err)
	}
	s.c.adminURL = scheme + ln.Addr().String()
	if t := s.cfg.Transport.TLS; t != nil {
		ln = tls.NewListener(ln, t)
	}
	s.log.Info("admin API and console served", "url", s.c.adminURL+"/api/v1")
	s.c.goServe(func(ctx context.Context) error {
		if err := grpcsplit.ServeHTTP(ctx, ln, mux, s.cfg.ShutdownTimeout, s.cfg.Transport.Conns); err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		return nil
	})
	return nil
}

// serveMetrics serves /metrics on MetricsListen.
func (s *checkerStart) serveMetrics() error {
	ln, err := net.Listen("tcp", s.cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("metrics listen: %w", err)
	}
	s.log.Info("metrics served", "url", "http://"+ln.Addr().String()+"/metrics")
	metrics := http.NewServeMux()
	metrics.Handle("GET /metrics", s.tel.Metrics)
	s.c.goServe(func(ctx context.Context) error {
		if err := grpcsplit.ServeHTTP(ctx, ln, metrics, s.cfg.ShutdownTimeout, s.cfg.Transport.Conns); err != nil {
			return fmt.Errorf("metrics listen: %w", err)
		}
		return nil
	})
	return nil
}

// redisName names the Redis of rdb in logs: a server's address, a cluster's seeds, a Sentinel
// group's master.
func redisName(rdb redis.UniversalClient) string {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return "cluster " + strings.Join(c.Options().Addrs, ",")
	case *redis.Client:
		return c.Options().Addr
	}
	return fmt.Sprintf("%T", rdb)
}
