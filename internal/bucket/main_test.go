package bucket

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// srv is the package's Redis, shared by all tests: one server, or a cluster when the suite runs
// on one (redistest.TopologyEnv); tests isolate themselves by key prefix.
var srv *redistest.Shared

// testLayout is the Layout of the Stores the tests build (newStore, ownStore, and others
// through storeConfig): QUOTAFLOW_TEST_LAYOUT, "previous" (the default), "compact", "shared" or
// "mixed", so that the whole suite runs on each (make test-shared).
var testLayout Layout

func TestMain(m *testing.M) {
	if v := os.Getenv("QUOTAFLOW_TEST_LAYOUT"); v != "" {
		l, err := parseLayout(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bucket: QUOTAFLOW_TEST_LAYOUT: %v\n", err)
			os.Exit(2)
		}
		testLayout = l
	}
	code := redistest.MainShared(m, &srv)
	if n := proctest.Goroutines(batchLoop); code == 0 && n > 0 {
		// Close waits for the loops: any left belong to a Store its test never closed.
		fmt.Fprintf(os.Stderr, "bucket: %d batching goroutines still running after the tests: a Store was not closed\n", n)
		code = 1
	}
	os.Exit(code)
}

// long is a window long enough that refill during a test is far below one unit.
const long = 30 * 24 * time.Hour

// allAlgorithms is every algorithm of the table that counts units, so that a new one is tested
// like the others. A derived one (algorithm.CalendarWindow, whose periods no generic window gives) and
// one of held places (algorithm.Concurrency, which counts checks in flight, not their cost) have tests of their
// own (calendar_test.go, concurrency_test.go).
var allAlgorithms = slices.DeleteFunc(slices.Collect(algorithm.All), func(a algorithm.ID) bool {
	return a.Derived() || a.Holds()
})

func client(t testing.TB) redis.UniversalClient {
	t.Helper()
	c := srv.UniversalClient()
	t.Cleanup(func() { c.Close() })
	return c
}

func newStore(t testing.TB) (*Store, redis.UniversalClient) {
	c := client(t)
	s := NewStoreWithConfig(c, storeConfig(StoreConfig{}))
	t.Cleanup(func() { s.Close() })
	return s, c
}

var (
	testSeq atomic.Int64
	testIDs sync.Map // testing.TB -> int64
)

// key returns a key unique to the test run (also across -count repetitions, which share the
// server), hash-tagged by the test so that a subject's keys share a cluster slot.
func key(t testing.TB, name string) string {
	id, _ := testIDs.LoadOrStore(t, testSeq.Add(1))
	return fmt.Sprintf("{%s#%d}:%s", strings.ReplaceAll(t.Name(), "/", ":"), id, name)
}

// serverOf is the server holding key: c itself, or on a cluster the master of key's slot.
func serverOf(t testing.TB, c redis.UniversalClient, key string) redis.Cmdable {
	t.Helper()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return c
	}
	m, err := cc.MasterForKey(ctxT(t), key)
	if err != nil {
		t.Fatalf("master of %s: %v", key, err)
	}
	return m
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// check runs one request and fails the test on error.
func check(t testing.TB, s *Store, req Request) Result {
	t.Helper()
	res, err := s.Check(ctxT(t), []Request{req})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if len(res) != 1 {
		t.Fatalf("Check returned %d results, want 1", len(res))
	}
	return res[0]
}

func lim(k string, a algorithm.ID, limit int64, window time.Duration, burst int64) Limit {
	return Limit{Key: k, Algorithm: a, Limit: limit, Window: window, Burst: burst}
}

func one(l Limit, cost int64) Request {
	return Request{Limits: []Limit{l}, Cost: cost}
}

func peekReq(l Limit) Request {
	return Request{Limits: []Limit{l}, Cost: 1, Peek: true}
}

// checkInvariants checks what holds for every result of every algorithm.
func checkInvariants(t testing.TB, req Request, res Result) {
	t.Helper()
	if len(res.Limits) != len(req.Limits) {
		t.Fatalf("got %d limit results, want %d", len(res.Limits), len(req.Limits))
	}
	all := true
	for i, lr := range res.Limits {
		all = all && lr.Allowed
		if lr.Remaining < 0 || lr.Used < 0 {
			t.Errorf("limit %d: used %d remaining %d, want both >= 0", i, lr.Used, lr.Remaining)
		}
		if c := req.Limits[i].Capacity(); lr.Remaining > c {
			t.Errorf("limit %d: remaining %d > capacity %d", i, lr.Remaining, c)
		}
		if lr.Allowed && lr.RetryAfter != 0 {
			t.Errorf("limit %d: allowed with retry after %v, want 0", i, lr.RetryAfter)
		}
		if !lr.Allowed && lr.RetryAfter <= 0 {
			t.Errorf("limit %d: denied with retry after %v, want > 0", i, lr.RetryAfter)
		}
		if lr.ResetAt.Before(res.Now) {
			t.Errorf("limit %d: reset at %v before now %v", i, lr.ResetAt, res.Now)
		}
	}
	if res.Allowed != all {
		t.Errorf("allowed %v, but limits allowed %v", res.Allowed, all)
	}
}

func near(got, want, tolerance time.Duration) bool {
	d := got - want
	return d >= -tolerance && d <= tolerance
}

// batchLoop is the frame of a bucket.Store's batching goroutine.
const batchLoop = "bucket.(*batcher).loop("

// ownServer starts a Redis of the test's own, for a test that stops, pauses or configures it,
// and returns it with a client of database 0; both are closed when the test ends.
func ownServer(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	own, err := redistest.Start()
	if err != nil {
		t.Fatalf("start redis: %v", err)
	}
	t.Cleanup(own.Close)
	c := own.Client(0)
	t.Cleanup(func() { c.Close() })
	return own, c
}

// ownStore starts a Redis of the test's own, which it may stop, stall or inspect, and a Store
// of cfg on it; all end with the test.
func ownStore(t *testing.T, cfg StoreConfig) (*redistest.Server, *redis.Client, *Store) {
	t.Helper()
	own, c := ownServer(t)
	s := NewStoreWithConfig(c, storeConfig(cfg))
	t.Cleanup(func() { s.Close() })
	return own, c, s
}

// storeConfig is cfg with the tests' layout (testLayout) unless cfg names one.
func storeConfig(cfg StoreConfig) StoreConfig {
	if cfg.Layout == LayoutPrevious {
		cfg.Layout = testLayout
	}
	return cfg
}

// twin is one way a test decides requests: through Redis (Store), or through Local, the
// scripts' Go twin, which must answer alike.
type twin struct {
	name  string
	check func(t testing.TB, reqs []Request) []Result
}

// one decides req alone.
func (tw twin) one(t testing.TB, req Request) Result { return tw.check(t, []Request{req})[0] }

// twins are s and a new Local, whose clock moves step per call.
func twins(s *Store, step time.Duration) []twin {
	local := NewLocal(0)
	var mu sync.Mutex
	at := time.Now()
	return []twin{
		{"store", func(t testing.TB, reqs []Request) []Result {
			t.Helper()
			res, err := s.Check(ctxT(t), reqs)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			return res
		}},
		{"local", func(_ testing.TB, reqs []Request) []Result {
			mu.Lock()
			at = at.Add(step)
			now := at
			mu.Unlock()
			return local.CheckAll(now, reqs)
		}},
	}
}
