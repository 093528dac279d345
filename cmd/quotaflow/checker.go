package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// checkerFlags are the checker's settings, shared by the commands that run one.
type checkerFlags struct {
	listen          string
	redisURL        string
	rulesPath       string
	redisTimeout    time.Duration
	shutdownTimeout time.Duration
	logLevel        string
	logFormat       string
}

func (c *checkerFlags) register(fs *flagSet) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` to serve the check API on")
	fs.fromEnv("listen", "QUOTAFLOW_LISTEN")
	fs.StringVar(&c.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the buckets, a redis:// or rediss:// `URL`")
	fs.fromEnv("redis-url", "QUOTAFLOW_REDIS_URL")
	fs.StringVar(&c.rulesPath, "rules", "", "rules `file` (YAML; required)")
	fs.fromEnv("rules", "QUOTAFLOW_RULES")
	fs.DurationVar(&c.redisTimeout, "redis-timeout", 50*time.Millisecond, "deadline of each check's Redis call; past it each rule's fail_mode decides")
	fs.fromEnv("redis-timeout", "QUOTAFLOW_REDIS_TIMEOUT")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long to let requests in flight finish on SIGTERM")
	fs.fromEnv("shutdown-timeout", "QUOTAFLOW_SHUTDOWN_TIMEOUT")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.fromEnv("log-level", "QUOTAFLOW_LOG_LEVEL")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.fromEnv("log-format", "QUOTAFLOW_LOG_FORMAT")
}

func (c *checkerFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format: want text or json, got %q", c.logFormat)}
}

func (c *checkerFlags) redisClient() (*redis.Client, error) {
	if !strings.HasPrefix(c.redisURL, "redis://") && !strings.HasPrefix(c.redisURL, "rediss://") {
		return nil, usageError{fmt.Errorf("--redis-url: want a redis:// or rediss:// URL, got %q", c.redisURL)}
	}
	opts, err := redis.ParseURL(c.redisURL)
	if err != nil {
		return nil, usageError{fmt.Errorf("--redis-url: %w", err)}
	}
	// Without it go-redis ignores context deadlines, and --redis-timeout would not bound a check.
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
}

func runChecker(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("checker", `Serves quotaflow.v1.RateLimiter over Connect, gRPC and gRPC-Web (HTTP/1.1 and h2c), with gRPC
reflection and health, GET /ratelimit/check for gateways, /healthz and /readyz, all on one port.
Buckets live in Redis; the rules file is validated at start and any problem stops the start.`, stderr)
	var c checkerFlags
	c.register(fs)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if c.rulesPath == "" {
		return usageError{errors.New("--rules (or QUOTAFLOW_RULES) is required")}
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	set, err := rules.Load(c.rulesPath)
	if err != nil {
		return err
	}
	rdb, err := c.redisClient()
	if err != nil {
		return err
	}
	defer rdb.Close()
	srv := checker.New(checker.Config{Redis: rdb, Rules: set, RedisTimeout: c.redisTimeout, Logger: log})
	defer srv.Close()
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("checker listening", "url", "http://"+ln.Addr().String(), "rules", c.rulesPath,
		"rule_count", len(set.Rules()), "redis", rdb.Options().Addr)
	return serveHTTP(ctx, ln, srv.Handler(), c.shutdownTimeout, log)
}

// serveHTTP serves h on ln with HTTP/1.1 and cleartext HTTP/2 (gRPC) until ctx is done, then
// shuts down gracefully within timeout.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration, log *slog.Logger) error {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: h, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		log.Info("shutting down", "timeout", timeout)
		sctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	})
	return g.Wait()
}
