package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// redisSrv is the package's shared Redis; tests isolate themselves by identifier.
var redisSrv *redistest.Shared

func TestMain(m *testing.M) { os.Exit(checkertest.MainShared(m, &redisSrv)) }

const testRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: user-orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: user-big, dimension: user, endpoint: /big, algorithm: fixed_window, limit: 1000, window: 1h}
  - {id: ip-api, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: fm-closed, dimension: user, endpoint: /fm/closed, algorithm: fixed_window, limit: 1, window: 1h, fail_mode: closed}
  - {id: user-search, dimension: user, endpoint: /api/v1/search, algorithm: sliding_window_log, limit: 100, window: 1h}
  - {id: user-inflight, dimension: user, endpoint: /stream, algorithm: concurrency, limit: 2, window: 1m}
  - {id: tenant-reports, dimension: tenant, endpoint: /reports, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: user-paced, dimension: user, endpoint: /paced, algorithm: gcra, limit: 10, window: 1s, burst: 1, on_limit: delay, max_delay: 1s}
entitlements:
  - {id: tokens, dimension: user, period: 1mo}
`

// testTimeout is the clients' deadline per attempt in tests that assert the checker's
// decisions: far above a check's latency, so that a loaded machine (the race detector, every
// package at once) never hands a check to the fail mode. A stopped checker refuses connections
// at once, so it does not slow the outage tests.
const testTimeout = 10 * time.Second

// testChecker is a real checker on real Redis, on a loopback port it can leave and take again.
type testChecker struct {
	t       *testing.T
	engine  *checker.Engine
	handler http.Handler
	srv     *transport.Server
	addr    string
	stop    func()
	// calls counts the RPCs served, whichever stack served them.
	calls atomic.Int64
	// failNext, when set, makes the next Connect call be decided and then answered 503, as if
	// the connection broke after the checker charged.
	failNext atomic.Bool
	// hold, when set, makes the next HTTP call wait until the channel is closed before it is
	// served: a batch in flight for as long as a test needs.
	hold atomic.Pointer[chan struct{}]
}

func newChecker(t *testing.T) *testChecker {
	t.Helper()
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	return newCheckerOn(t, rdb)
}

// newCheckerOn is newChecker on rdb.
func newCheckerOn(t *testing.T, rdb redis.UniversalClient) *testChecker {
	t.Helper()
	engine := checker.New(checker.Config{Redis: rdb, Rules: checkertest.Rules(t, testRules), RedisTimeout: 5 * time.Second, Logger: checkertest.Logger()})
	t.Cleanup(func() { engine.Close() })
	c := &testChecker{t: t, engine: engine, srv: transport.New(engine, transport.Config{Logger: checkertest.Logger()})}
	h := c.srv.Handler()
	c.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.calls.Add(1)
		if g := c.hold.Swap(nil); g != nil {
			<-*g
		}
		if c.failNext.CompareAndSwap(true, false) {
			h.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "connection lost", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
	c.start("127.0.0.1:0")
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *testChecker) url() string { return "http://" + c.addr }

// start serves on addr until Stop.
func (c *testChecker) start(addr string) {
	c.t.Helper()
	var ln net.Listener
	var err error
	// The port of a stopped checker can take a moment to be free again.
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.addr = ln.Addr().String()
	gs := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		c.calls.Add(1)
		return h(ctx, req)
	}))
	c.srv.RegisterGRPC(gs)
	hs := &http.Server{Handler: c.handler, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- grpcsplit.Serve(ctx, ln, gs, hs, time.Second, grpcsplit.Config{}) }()
	c.stop = func() {
		cancel()
		// A checker stopped as soon as it started may stop grpc-go before it serves.
		if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, grpc.ErrServerStopped) {
			c.t.Errorf("serve: %v", err)
		}
		c.stop = func() {}
	}
}

// restart serves again on the same port.
func (c *testChecker) restart() { c.start(c.addr) }

// user is an identifier of the test run's own: tests share one Redis, and -count=N runs them
// again on it.
var user = checkertest.ID
