package checker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestLeasedFailover: with the master of the global subject killed under allotted load, every
// check is answered within its deadline (from the slice while it lasts, then by the rule's fail
// mode, reported degraded), and once the replica is promoted checks are exact again and allotted
// again, without a new engine.
func TestLeasedFailover(t *testing.T) {
	t.Parallel()
	for _, topo := range failoverTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			cfg, killMaster := topo.start(t)
			rdb, err := bucket.NewRedisClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			ep := leaseEndpoint(t)
			reader := sdkmetric.NewManualReader()
			e := New(Config{Redis: rdb, Rules: mustRules(t, fmt.Sprintf(`rules:
  - {id: hot, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 1000000000, window: 1h, lease: {slice: 20}}
`, ep)), RedisTimeout: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond, Logger: checkertest.Logger(),
				Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")})
			defer e.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var answered, degraded, errs, slow atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						out, err := e.Check(context.Background(), userQuery("u", ep))
						if time.Since(start) > 2*time.Second { // ten times the Redis deadline: a loaded CI machine's margin
							slow.Add(1)
						}
						switch {
						case err != nil:
							errs.Add(1)
						case out.Degraded:
							degraded.Add(1)
							answered.Add(1)
						default:
							answered.Add(1)
						}
						time.Sleep(time.Millisecond)
					}
				})
			}
			time.Sleep(300 * time.Millisecond)
			wait := killMaster(ctx, windowKey(ep))
			killed := time.Now()
			if err := wait(ctx); err != nil {
				t.Fatal(err)
			}
			leasedBefore := counterSum(t, reader, "quotaflow.lease.units")
			var exactAgain time.Duration
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				out, err := e.Check(context.Background(), userQuery("u", ep))
				if err == nil && !out.Degraded && counterSum(t, reader, "quotaflow.lease.units") > leasedBefore {
					exactAgain = time.Since(killed)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("checks not exact and leased 30s after the failover: %v %v", out, err)
				}
			}
			close(stop)
			wg.Wait()
			t.Logf("exact and leased again %v after the kill; answered %d (degraded %d), errors %d, slower than 2s %d",
				exactAgain, answered.Load(), degraded.Load(), errs.Load(), slow.Load())
			if errs.Load() != 0 || slow.Load() != 0 {
				t.Errorf("%d checks failed and %d took over 2s during the failover, want every one answered within its deadline", errs.Load(), slow.Load())
			}
		})
	}
}
