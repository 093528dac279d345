package transport

import (
	"net/http"
	"net/netip"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// redisSrv is the package's shared Redis: one server, or a cluster when the suite runs on one
// (redistest.TopologyEnv). Tests isolate themselves by identifier (each uses names derived
// from t.Name()), never by flushing.
var redisSrv *redistest.Shared

func TestMain(m *testing.M) { os.Exit(checkertest.MainShared(m, &redisSrv)) }

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
  - {id: user-delay, dimension: user, endpoint: /delay, algorithm: gcra, limit: 5, window: 1s, burst: 1, on_limit: delay, max_delay: 600ms}
  - {id: ip-api, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: key-api, dimension: apikey, endpoint: /api/*, algorithm: gcra, limit: 10, window: 1h}
  - {id: user-api, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 10, window: 1h, burst: 4}
  - {id: global-g, dimension: global, endpoint: /global/*, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: fm-open, dimension: user, endpoint: /fm/open, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: fm-closed, dimension: user, endpoint: /fm/closed, algorithm: fixed_window, limit: 1, window: 1h, fail_mode: closed}
  - {id: fm-local, dimension: user, endpoint: /fm/local, algorithm: fixed_window, limit: 2, window: 1h, fail_mode: local}
`

var (
	mustRules = checkertest.Rules
	id        = checkertest.ID
	testIP    = checkertest.IP
	newRedis  = checkertest.Redis
	h2cClient = checkertest.H2CClient
	ownRedis  = checkertest.OwnRedis
)

type testEnv struct {
	engine *checker.Engine
	srv    *Server
	url    string
	http   *http.Client // speaks HTTP/1.1 and h2c
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

// newEnv serves a checker for cfg over real HTTP (HTTP/1.1 and h2c) on loopback, as a
// checker behind a trusted gateway is configured: anonymous callers may check, assert tiers and
// reset, the loopback proxy is trusted and forward-auth reads X-Idempotency-Key. Tests of those
// defaults use newEnvWith. Without a Redis in cfg it uses the package's shared server.
// loadedTimeout is the engines' Redis deadline in tests: generous, so that a loaded CI machine
// (race detector, parallel tests) never degrades a decision a test asserts on (a check past the
// default 50ms is decided by its fail mode, an admin allowance by this process's own bucket);
// failure tests set their own.
const loadedTimeout = 5 * time.Second

func newEnv(t testing.TB, cfg checker.Config) *testEnv {
	t.Helper()
	callers := new(auth.Registry)
	if err := callers.Load([]byte("anonymous: {permissions: [check, assert-tier, reset]}\n")); err != nil {
		t.Fatal(err)
	}
	return newEnvWith(t, cfg, Config{Callers: callers, ForwardAuth: ForwardAuthConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, IdempotencyHeader: "X-Idempotency-Key"}})
}

// newEnvWith is newEnv with the transport's configuration.
func newEnvWith(t testing.TB, cfg checker.Config, tcfg Config) *testEnv {
	t.Helper()
	if cfg.Redis == nil {
		rdb := redisSrv.UniversalClient()
		t.Cleanup(func() { rdb.Close() })
		cfg.Redis = rdb
	}
	if cfg.Rules == nil {
		cfg.Rules = mustRules(t, testRules)
	}
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = loadedTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = checkertest.Logger()
	}
	engine := checker.New(cfg)
	t.Cleanup(func() { engine.Close() })
	tcfg.Logger = cfg.Logger
	if tcfg.Lockout == nil {
		// Every test calls from 127.0.0.1 and shares its failure bucket: lockouts are tested
		// with a Redis of their own (lockout_test.go).
		tcfg.Lockout = auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: 1e6, TrustedProxies: tcfg.ForwardAuth.TrustedProxies})
	}
	srv := New(engine, tcfg)
	url := checkertest.Serve(t, srv.Handler(), srv.RegisterGRPC)
	return &testEnv{engine: engine, srv: srv, url: url, http: checkertest.HTTPClient()}
}

// healthClient calls grpc.health.v1.Health/Check over gRPC.
func healthClient(url string) *connect.Client[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse] {
	return connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](h2cClient(), url+healthCheckProcedure, connect.WithGRPC())
}

// ownRedisEnv serves a checker on a Redis of its own, which the test may stop, stall or inspect.
func ownRedisEnv(t *testing.T, cfg checker.Config) (*redistest.Server, *testEnv, *redis.Client) {
	t.Helper()
	rs, rdb := ownRedis(t)
	cfg.Redis = rdb
	return rs, newEnv(t, cfg), rdb
}
