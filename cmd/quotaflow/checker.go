package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/telemetry"
)

// checkerFlags are the checker's settings, shared by the commands that run one.
type checkerFlags struct {
	cfg            daemon.CheckerConfig
	logLevel       string
	logFormat      string
	overLimitCache bool
	idKeysFile     string
	natsTLS        clientTLSFlags
	admin          adminFlags
	callers        callerFlags
	tls            serverTLSFlags
	redis          redisFlags
	serving        servingFlags
}

func (c *checkerFlags) register(fs *cli.FlagSet) {
	fs.StringVar(&c.cfg.Listen, "listen", "127.0.0.1:8080", "`address` to serve the check API on")
	registerHealthInterval(fs, &c.cfg.Health)
	fs.StringVar(&c.cfg.RulesFile, "rules", "", "rules `file` (YAML); required without --nats-url. With --nats-url it seeds the rule store (NATS KV) when the store holds no rules yet, and is enforced while NATS is unreachable at start")
	fs.DurationVar(&c.cfg.RedisTimeout, "redis-timeout", 50*time.Millisecond, "deadline of each check's Redis call; past it each rule's fail_mode decides")
	fs.IntVar(&c.cfg.MaxInFlight, "max-in-flight", checker.DefaultMaxInFlight, "checks waiting for Redis at once; past it a check is answered at once by its rules' fail_mode, degraded (quotaflow_checks_shed_total); negative: no bound")
	fs.TextVar(&c.cfg.BucketLayout, "bucket-layout", bucket.LayoutPrevious, "how buckets are written in Redis, a `layout`: previous (what checkers of earlier versions read: keep it while one may still run, as in a rolling upgrade), compact (less Redis memory, read by this version and later), shared (fixed_window, gcra and token_bucket buckets as fields of shared hashes: about half compact's memory) or mixed (compact, but a bucket in a field stays there: the step of a rolling switch between compact and shared, either way); each reads the keys of all (docs/architecture.md)")
	fs.IntVar(&c.cfg.SharedHashes, "shared-hashes", 1, "hashes per cluster slot (16384 slots) holding the buckets of --bucket-layout shared: about buckets / 1.6M, so that a hash holds at most ~100; changing it starts those buckets over")
	fs.DurationVar(&c.cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long to let requests in flight finish on SIGTERM")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&c.cfg.InstanceID, "instance-id", "", "`name` of this checker in decision ids and events, e.g. the pod name; a random suffix keeps each process start unique")
	fs.BoolVar(&c.overLimitCache, "over-limit-cache", true, "answer checks of buckets known to deny until a known instant without a Redis call (exact)")
	fs.StringVar(&c.cfg.Tracing.OTLPEndpoint, "otlp-endpoint", "", "OTLP/HTTP traces `URL`, e.g. http://collector:4318/v1/traces (empty: no traces)")
	fs.Float64Var(&c.cfg.Tracing.SampleRatio, "trace-sample-ratio", 0.01, "share of checks traced when --otlp-endpoint is set")
	fs.StringVar(&c.cfg.DebugListen, "debug-listen", "", "`address` serving Go's /debug/pprof profiles (empty: off); keep it private")
	fs.StringVar(&c.cfg.AdminListen, "admin-listen", "", "`address` serving the admin API (/api/v1) and the console on a port of their own, and no longer on the check port, so that the check port can face callers alone (empty: on the check port)")
	fs.DurationVar(&c.cfg.JournalGrace, "journal-grace", checker.DefaultJournalGrace, "how long a balance burn's decision may take to reach the spool before the balance journal's sweeper publishes its moves again (docs/entitlements.md); the checkers sweep once per grace between them")
	fs.StringVar(&c.idKeysFile, "id-keys-file", "", "`file` of the keys that sign reservation and lease ids, one per line (at least 32 characters; # comments): the first signs, every one verifies, the same file on every checker; rotate by adding the new key first and dropping the old a day later. Empty: a key the checkers keep in Redis")
	fs.FromEnv("listen", "rules", "redis-timeout", "max-in-flight", "bucket-layout", "shared-hashes", "shutdown-timeout", "log-level",
		"log-format", "instance-id", "over-limit-cache", "otlp-endpoint", "trace-sample-ratio",
		"debug-listen", "admin-listen", "id-keys-file", "journal-grace")
	c.admin.register(fs, &c.cfg)
	c.callers.register(fs, &c.cfg)
	c.tls.register(fs)
	c.redis.register(fs)
	c.serving.register(fs, &c.cfg)
}

// registerHealthInterval adds --health-interval, the time between a daemon's health reports.
func registerHealthInterval(fs *cli.FlagSet, cfg *health.Config) {
	fs.DurationVar(&cfg.Interval, "health-interval", health.DefaultInterval, "time between this process's health reports into NATS (quotaflow status); negative: no reports")
	fs.FromEnv("health-interval")
}

// newLogger returns the logger the --log-level and --log-format flags ask for.
func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	log, err := telemetry.NewLogger(level, format, w)
	return log, cli.FlagError(err, nil)
}

func runChecker(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("checker", help("checker"), stderr)
	var c checkerFlags
	c.register(fs)
	c.registerPublish(fs, "quotaflow-spool")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if _, err := c.validate(stderr); err != nil {
		return err
	}
	if pct, ok := checkerGCPercent(getenv); ok {
		debug.SetGCPercent(pct)
	}
	d, err := c.start(ctx)
	if err != nil {
		return err
	}
	return serveUntil(ctx, d)
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

// checkerFlagNames are the flags of daemon.CheckerConfig's fields not spelled as the field
// (fieldFlagErr), or named in another field's error.
var checkerFlagNames = map[string]string{
	"RulesFile": "rules", "NATSURL": "nats-url", "NATSCredentials": "nats-creds",
	"NATSAdminCredentials": "nats-admin-creds", "Tracing.SampleRatio": "trace-sample-ratio",
	"Publisher.Replicas": "stream-replicas", "Publisher.MaxAge": "stream-max-age",
	"Publisher.DuplicateWindow": "stream-duplicate-window", "Publisher.MaxBatch": "publish-batch",
	"Publisher.FlushInterval": "publish-flush", "Transport.Conns.MaxConns": "max-connections",
	"Admin.ReadPerMinute": "admin-read-per-minute", "Admin.WritePerMinute": "admin-write-per-minute",
	"Admin.AuthFailuresPerMinute": "admin-auth-failures-per-minute",
	"AuditClickHouseDSN":          "audit-clickhouse-dsn", "IDKeys": "id-keys-file", "Health.Interval": "health-interval",
	"TokensFile": "admin-tokens-file", "Token": "admin-token",
}

// checkerFlagErr names the flag of a daemon.CheckerConfig's field error.
func checkerFlagErr(err error) error {
	if errors.Is(err, daemon.ErrRulesRequired) {
		return cli.Usagef("--rules (or QUOTAFLOW_RULES) is required without --nats-url (with it, the rule store is the source)")
	}
	return cli.FlagError(err, checkerFlagNames)
}

// validate completes the checker's config from its flags, checks it and returns its logger.
func (c *checkerFlags) validate(stderr io.Writer) (*slog.Logger, error) {
	cfg := &c.cfg
	cfg.DisableOverLimitCache, cfg.Publisher.NoSpoolWait = !c.overLimitCache, cfg.Publisher.SpoolWait == 0
	if err := cfg.Validate(); err != nil {
		return nil, checkerFlagErr(err)
	}
	var err error
	for _, check := range []func() error{c.serving.validate, c.callers.validate,
		func() (err error) {
			cfg.Admin.Tokens, err = admin.LoadTokens(c.admin.tokensFile, c.admin.token)
			return cli.FlagError(err, checkerFlagNames)
		},
		func() (err error) {
			cfg.IDKeys, err = daemon.ReadIDKeys(c.idKeysFile)
			return cli.FlagError(err, checkerFlagNames)
		},
		func() (err error) { cfg.Transport.TLS, err = c.tls.config(); return err },
		func() (err error) { cfg.NATSTLS, err = c.natsTLS.config(""); return err },
	} {
		if err = check(); err != nil {
			return nil, cli.Usage(err)
		}
	}
	cfg.Transport.HideReflection = c.serving.reflection == "off" || c.serving.reflection == "auto" && cfg.CallersFile != ""
	cfg.Logger, err = newLogger(c.logLevel, c.logFormat, stderr)
	return cfg.Logger, err
}

// start connects the Redis the flags name and starts the checker.
func (c *checkerFlags) start(ctx context.Context) (*daemon.Checker, error) {
	rdb, err := c.redis.client(ctx)
	if err != nil {
		return nil, err
	}
	c.cfg.Redis = rdb
	d, err := daemon.StartChecker(ctx, c.cfg)
	return d, flagErr(err)
}

// serveUntil serves until ctx is done (SIGTERM) or the daemon fails, then closes it.
func serveUntil(ctx context.Context, d interface {
	Done() <-chan struct{}
	Close() error
}) error {
	select {
	case <-ctx.Done():
	case <-d.Done():
	}
	return d.Close()
}
