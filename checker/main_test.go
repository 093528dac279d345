package checker

import (
	"os"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// redisSrv is the package's shared Redis: one server, or a cluster when the suite runs on one
// (redistest.TopologyEnv). Tests isolate themselves by identifier (each
// uses names derived from t.Name()), never by flushing. The engine's behaviour through every
// transport is tested in checker/transport; the tests here call the engine directly.
var redisSrv *redistest.Shared

func TestMain(m *testing.M) { os.Exit(checkertest.MainShared(m, &redisSrv)) }

const testRules = `
rules:
  - {id: user-api, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 10, window: 1h, burst: 4}
`

var mustRules = checkertest.Rules

// newEngine returns an engine on the package's Redis, closed with the test.
func newEngine(t testing.TB, cfg Config) *Engine {
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
		cfg.RedisTimeout = 5 * time.Second // a loaded CI machine must not degrade a decision
	}
	if cfg.Logger == nil {
		cfg.Logger = checkertest.Logger()
	}
	e := New(cfg)
	t.Cleanup(func() { e.Close() })
	return e
}

// userQuery is a check of one user at endpoint.
func userQuery(user, endpoint string) *Query {
	return &Query{Subjects: []Subject{{Dimension: 1, ID: user}}, Endpoint: endpoint, Cost: 1}
}
