package checker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/redistest"
	"github.com/quotaflow/quotaflow/internal/rules"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// redisSrv is the package's shared redis-server. Tests isolate themselves by identifier (each
// uses names derived from t.Name()), never by flushing.
var redisSrv *redistest.Server

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &redisSrv)) }

// testRules covers every algorithm, dimension, tier, fail mode and shadow.
const testRules = `
default_tier: free
tiers: {free: {}, premium: {}}
users:
  vip: {tier: premium}
  custom: {limits: {user-orders: 2}}
rules:
  - {id: user-orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 5, window: 1h}
  - {id: user-orders-premium, dimension: user, endpoint: /orders, tier: premium, algorithm: fixed_window, limit: 50, window: 1h}
  - {id: user-tb, dimension: user, endpoint: /tb, algorithm: token_bucket, limit: 3, window: 1h}
  - {id: user-lb, dimension: user, endpoint: /lb, algorithm: leaky_bucket, limit: 3, window: 1h}
  - {id: user-swl, dimension: user, endpoint: /swl, algorithm: sliding_window_log, limit: 3, window: 1h}
  - {id: user-swc, dimension: user, endpoint: /swc, algorithm: sliding_window_counter, limit: 3, window: 1h}
  - {id: user-gcra, dimension: user, endpoint: /gcra, algorithm: gcra, limit: 3, window: 1h}
  - {id: user-multi-min, dimension: user, endpoint: /multi, algorithm: token_bucket, limit: 2, window: 1m}
  - {id: user-multi-day, dimension: user, endpoint: /multi, algorithm: fixed_window, limit: 100, window: 24h}
  - {id: user-shadow, dimension: user, endpoint: /shadow, algorithm: fixed_window, limit: 1, window: 1h, shadow: true}
  - {id: user-fast, dimension: user, endpoint: /fast, algorithm: gcra, limit: 2, window: 200ms}
  - {id: ip-api, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: key-api, dimension: apikey, endpoint: /api/*, algorithm: gcra, limit: 10, window: 1h}
  - {id: user-api, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 10, window: 1h, burst: 4}
  - {id: global-g, dimension: global, endpoint: /global/*, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: fm-open, dimension: user, endpoint: /fm/open, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: fm-closed, dimension: user, endpoint: /fm/closed, algorithm: fixed_window, limit: 1, window: 1h, fail_mode: closed}
  - {id: fm-local, dimension: user, endpoint: /fm/local, algorithm: fixed_window, limit: 2, window: 1h, fail_mode: local}
`

func mustRules(t testing.TB, doc string) *rules.Set {
	t.Helper()
	s, err := rules.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return s
}

type testEnv struct {
	srv  *Server
	url  string
	http *http.Client // speaks HTTP/1.1 and h2c
}

// client returns a RateLimiter client for protocol connect, grpc or grpcweb.
func (e *testEnv) client(protocol string) quotaflowv1connect.RateLimiterClient {
	var opts []connect.ClientOption
	switch protocol {
	case "grpc":
		opts = append(opts, connect.WithGRPC())
	case "grpcweb":
		opts = append(opts, connect.WithGRPCWeb())
	}
	return quotaflowv1connect.NewRateLimiterClient(e.http, e.url, opts...)
}

// newEnv serves a checker for cfg over real HTTP (HTTP/1.1 and h2c) on loopback. Without a
// Redis in cfg it uses the package's shared server.
func newEnv(t testing.TB, cfg Config) *testEnv {
	t.Helper()
	if cfg.Redis == nil {
		rdb := newRedis(redisSrv.Addr)
		t.Cleanup(func() { rdb.Close() })
		cfg.Redis = rdb
	}
	if cfg.Rules == nil {
		cfg.Rules = mustRules(t, testRules)
	}
	if cfg.RedisTimeout == 0 {
		// Generous, so that a loaded CI machine (race detector, parallel tests) never degrades
		// a decision a test asserts on; failure tests set their own.
		cfg.RedisTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(debugOut(), nil))
	}
	srv := New(cfg)
	url := serve(t, srv, srv.Handler())
	t.Cleanup(func() { srv.Close() })
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetHTTP1(true)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &testEnv{srv: srv, url: url, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// serve serves h and srv's gRPC services on one loopback port, split as the quotaflow command
// splits them, until the test ends; it returns the base URL.
func serve(t testing.TB, srv *Server, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.RegisterGRPC(gs)
	hs := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- grpcsplit.Serve(ctx, ln, gs, hs, time.Second, grpcsplit.Config{}) }()
	t.Cleanup(func() {
		cancel()
		// Streams a test left open (reflection, health Watch) are cut off at the timeout.
		if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// h2cClient forces HTTP/2 without TLS, as gRPC clients do.
func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// id makes an identifier unique to the running test.
func id(t testing.TB, name string) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + name
}

func newRedis(addr string) *redis.Client {
	// Default retries, as in production: a command on a pooled connection that died with a
	// restarted Redis is retried within the deadline.
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
}

// healthClient calls grpc.health.v1.Health/Check over gRPC.
func healthClient(url string) *connect.Client[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse] {
	return connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](h2cClient(), url+healthCheckProcedure, connect.WithGRPC())
}

// debugOut is where test checkers log: nowhere, or stderr with QF_DEBUG=1.
func debugOut() io.Writer {
	if os.Getenv("QF_DEBUG") != "" {
		return os.Stderr
	}
	return io.Discard
}

// ownRedisEnv serves a checker on a Redis of its own, which the test may stop, stall or inspect.
func ownRedisEnv(t *testing.T, cfg Config) (*redistest.Server, *testEnv, *redis.Client) {
	t.Helper()
	rs, rdb := ownRedis(t)
	cfg.Redis = rdb
	return rs, newEnv(t, cfg), rdb
}

// ownRedis starts a Redis of the test's own and a client of it, both ending with the test.
func ownRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	rdb := newRedis(rs.Addr)
	t.Cleanup(func() { rdb.Close() })
	return rs, rdb
}
