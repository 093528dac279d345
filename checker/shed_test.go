package checker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

const shedRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: open, dimension: user, endpoint: /open, algorithm: fixed_window, limit: 100, window: 1h, fail_mode: open}
  - {id: closed, dimension: user, endpoint: /closed, algorithm: fixed_window, limit: 100, window: 1h, fail_mode: closed}
  - {id: local, dimension: user, endpoint: /local, algorithm: fixed_window, limit: 2, window: 1h, fail_mode: local}
`

// stalledRedis starts a Redis of the test's own, then returns a client of it and a function
// that stops the server's process (SIGSTOP: it holds its connections and answers nothing) and
// returns the one that resumes it. Stalling the package's shared Redis would stall every test.
func stalledRedis(t *testing.T) (*redistest.Server, func() (resume func())) {
	t.Helper()
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	rdb := srv.Client(0)
	defer rdb.Close()
	info, err := rdb.InfoMap(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(info["Server"]["process_id"])
	if err != nil {
		t.Fatalf("redis process_id: %v", err)
	}
	return srv, func() func() {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		resume := func() { once.Do(func() { syscall.Kill(pid, syscall.SIGCONT) }) }
		t.Cleanup(resume) // before srv.Close: a stopped server cannot be stopped gracefully
		return resume
	}
}

// inFlight is the condition that n calls wait for the store: a condition, not a duration (the
// minute its callers give it only turns a hang into a failure).
func inFlight(e *Engine, n int64) func() error {
	return func() error {
		if got := e.guard.inFlight.Load(); got != n {
			return fmt.Errorf("%d calls in flight, want %d", got, n)
		}
		return nil
	}
}

// shedCount reads quotaflow.checks.shed.
func shedCount(t *testing.T, r *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "quotaflow.checks.shed" {
				var n int64
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					n += dp.Value
				}
				return n
			}
		}
	}
	return 0
}

// TestMaxInFlightSheds: with Redis stalled, MaxInFlight checks wait for it and every check past
// them is answered at once by its rule's fail mode — open allows, closed denies for a second,
// local charges this process's buckets — flagged degraded and counted in
// quotaflow.checks.shed, without a Redis call and without opening the circuit. The waiting
// checks are decided exactly by Redis once it resumes. Before, every check queued for Redis
// until its RedisTimeout.
func TestMaxInFlightSheds(t *testing.T) {
	t.Parallel()
	const maxInFlight = 4
	srv, stall := stalledRedis(t)
	rdb := srv.Client(0)
	t.Cleanup(func() { rdb.Close() })
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	// RedisTimeout is far beyond the test's checks, which take milliseconds: a check answered
	// while the waiters still wait was shed, not timed out. A check that queued instead would
	// return after it, with the waiters, and fail the test rather than hang it.
	e := newEngine(t, Config{Redis: rdb, Rules: checkertest.Rules(t, shedRules), MaxInFlight: maxInFlight,
		RedisTimeout: 20 * time.Second, ProbeInterval: time.Hour, Meter: meter, DisableOverLimitCache: true})
	query := func(user, endpoint string) *Query {
		return &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, user)}}, Endpoint: endpoint, Cost: 1}
	}
	ctx := context.Background()
	if _, err := e.Check(ctx, query("warm", "/open")); err != nil { // the script is loaded
		t.Fatal(err)
	}
	resume := stall()

	waiting := make(chan *Outcome, maxInFlight)
	var wg sync.WaitGroup
	for range maxInFlight {
		wg.Go(func() {
			out, err := e.Check(ctx, query("waiter", "/closed"))
			if err != nil {
				t.Error(err)
			}
			waiting <- out
		})
	}
	poll.Until(t, time.Minute, "the calls in flight", inFlight(e, maxInFlight))

	for _, tt := range []struct {
		endpoint      string
		checks        int
		allowed       int
		retryAfterMin time.Duration // of a denial
	}{
		{"/open", 5, 5, 0},
		{"/closed", 5, 0, closedRetryAfter},
		// The fixed window's own wait, from the local bucket: until the end of the hour (its
		// window), less a few seconds of the test's own run; a denial at least a nanosecond away.
		{"/local", 5, 2, max(time.Until(time.Now().Truncate(time.Hour).Add(time.Hour))-5*time.Second, 1)},
	} {
		t.Run(tt.endpoint, func(t *testing.T) {
			allowed := 0
			for i := range tt.checks {
				out, err := e.Check(ctx, query("shed", tt.endpoint))
				if err != nil {
					t.Fatalf("check %d: %v", i, err)
				}
				if !out.Degraded || !out.Limits[0].Degraded {
					t.Errorf("check %d: %+v, want degraded", i, out)
				}
				if out.Allowed {
					allowed++
				} else if ra := out.Limits[0].Result.RetryAfter; ra < tt.retryAfterMin {
					t.Errorf("check %d denied with retry_after %v, want at least %v", i, ra, tt.retryAfterMin)
				}
			}
			if allowed != tt.allowed {
				t.Errorf("%d shed checks of %s: %d allowed, want %d", tt.checks, tt.endpoint, allowed, tt.allowed)
			}
		})
	}
	peek, err := e.Peek(ctx, query("shed", "/open"))
	if err != nil || !peek.Degraded || !peek.Allowed {
		t.Errorf("peek past the bound: %+v, %v; want allowed, degraded", peek, err)
	}
	const shed = 5 + 5 + 5 + 1
	if got := shedCount(t, reader); got != shed {
		t.Errorf("quotaflow.checks.shed %d, want %d", got, shed)
	}
	if got := e.guard.inFlight.Load(); got != maxInFlight || len(waiting) != 0 {
		t.Errorf("%d in flight, %d answered while Redis is stopped; want %d in flight, none answered", got, len(waiting), maxInFlight)
	}
	if e.guard.circuit.open() {
		t.Error("shed checks opened the circuit")
	}

	resume()
	wg.Wait()
	close(waiting)
	for out := range waiting {
		if out != nil && (out.Degraded || !out.Allowed) {
			t.Errorf("check that waited for Redis: %+v, want an exact allow", out)
		}
	}
	if got := e.guard.inFlight.Load(); got != 0 {
		t.Errorf("%d in flight after every check returned, want 0", got)
	}
	// Shed checks never reached Redis: only the waiters charged the bucket.
	used, err := e.Peek(ctx, query("waiter", "/closed"))
	if err != nil || used.Degraded || used.Limits[0].Result.Used != maxInFlight {
		t.Errorf("waiters' bucket: %+v, %v; want %d used, exact", used, err, maxInFlight)
	}
	if out, err := e.Check(ctx, query("after", "/closed")); err != nil || out.Degraded || !out.Allowed {
		t.Errorf("check after the stall: %+v, %v; want an exact allow", out, err)
	}
}

// TestMaxInFlightUnbounded: without a bound (MaxInFlight negative), or under the default one,
// every check of a burst waits for a stalled Redis and is decided exactly once it resumes;
// nothing is shed.
func TestMaxInFlightUnbounded(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		maxInFlight int
	}{
		{"no bound", -1},
		{"default", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const checks = 64
			srv, stall := stalledRedis(t)
			rdb := srv.Client(0)
			t.Cleanup(func() { rdb.Close() })
			reader := sdkmetric.NewManualReader()
			e := newEngine(t, Config{Redis: rdb, Rules: checkertest.Rules(t, shedRules), MaxInFlight: tt.maxInFlight,
				RedisTimeout: time.Hour, ProbeInterval: time.Hour, Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")})
			q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}, Endpoint: "/closed", Cost: 1}
			if _, err := e.Peek(context.Background(), q); err != nil {
				t.Fatal(err)
			}
			resume := stall()
			var wg sync.WaitGroup
			outs := make([]*Outcome, checks)
			for i := range outs {
				wg.Go(func() {
					var err error
					if outs[i], err = e.Check(context.Background(), q); err != nil {
						t.Error(err)
					}
				})
			}
			if tt.maxInFlight == 0 {
				poll.Until(t, time.Minute, "the calls in flight", inFlight(e, checks)) // all queued for Redis, none shed
			}
			resume()
			wg.Wait()
			for i, out := range outs {
				if out != nil && (out.Degraded || !out.Allowed) {
					t.Errorf("check %d: %+v, want an exact allow", i, out)
				}
			}
			if got := shedCount(t, reader); got != 0 {
				t.Errorf("quotaflow.checks.shed %d, want 0", got)
			}
		})
	}
}
