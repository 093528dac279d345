package checker

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/checkertest"
	"github.com/quotaflow/quotaflow/internal/redistest"
)

// redisSrv is the package's shared Redis: one server, or a cluster when the suite runs on one
// (redistest.TopologyEnv). Tests isolate themselves by identifier (each
// uses names derived from t.Name()), never by flushing. The engine's behaviour through every
// transport is tested in checker/transport; the tests here call the engine directly.
var redisSrv *redistest.Shared

func TestMain(m *testing.M) {
	code := redistest.MainShared(m, &redisSrv)
	if n := storeLoops(); code == 0 && n > 0 {
		// Engine.Close closes its bucket.Store, whose Close waits for its goroutines: any left
		// belong to an engine or a store its test never closed.
		fmt.Fprintf(os.Stderr, "checker: %d bucket batching goroutines still running after the tests: an Engine or a Store was not closed\n", n)
		code = 1
	}
	os.Exit(code)
}

// storeLoops counts the goroutines running a bucket.Store's batch loop.
func storeLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "bucket.(*batcher).loop(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

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
