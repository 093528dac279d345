package admin

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// redisSrv is the package's shared Redis: one server, or a cluster when the suite runs on one
// (redistest.TopologyEnv); tests isolate themselves by identifier.
var redisSrv *redistest.Shared

func TestMain(m *testing.M) { os.Exit(checkertest.MainShared(m, &redisSrv)) }

// testEnv is a checker serving the check API and, under /api/v1, the admin API, as the
// quotaflow command mounts them.
type testEnv struct {
	engine *checker.Engine
	admin  *API
	url    string
	http   *http.Client
}

func newEnv(t testing.TB, cfg checker.Config, admin Config) *testEnv {
	t.Helper()
	if cfg.Redis == nil {
		rdb := redisSrv.UniversalClient()
		t.Cleanup(func() { rdb.Close() })
		cfg.Redis = rdb
	}
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = 5 * time.Second
	}
	cfg.Logger = checkertest.Logger()
	admin.Logger = cfg.Logger
	if admin.AuthFailuresPerMinute == 0 {
		admin.AuthFailuresPerMinute = 1e6 // every test calls from 127.0.0.1
	}
	engine := checker.New(cfg)
	t.Cleanup(func() { engine.Close() })
	// One failure budget for both APIs, as the quotaflow command wires them.
	if admin.Lockout == nil {
		admin.Lockout = auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: admin.AuthFailuresPerMinute, Logger: cfg.Logger})
	}
	// The admin API's write tokens are admin callers of the check API, as the command makes them.
	callers := new(auth.Registry)
	writers := map[string]string{}
	for tok, who := range admin.Tokens {
		if who.Role == RoleWrite {
			writers[tok] = who.Name
		}
	}
	callers.SetAdminTokens(writers)
	srv := transport.New(engine, transport.Config{Callers: callers, Lockout: admin.Lockout, Logger: cfg.Logger})
	mux := http.NewServeMux()
	api := New(engine, admin)
	mux.Handle("/api/v1/", api.Handler())
	mux.Handle("/", srv.Handler())
	return &testEnv{engine: engine, admin: api, url: checkertest.Serve(t, mux, srv.RegisterGRPC), http: checkertest.HTTPClient()}
}

func (e *testEnv) client(string) quotaflowv1connect.RateLimiterClient {
	return quotaflowv1connect.NewRateLimiterClient(e.http, e.url)
}

var (
	id       = checkertest.ID
	ownRedis = checkertest.OwnRedis
)
