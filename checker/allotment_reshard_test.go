package checker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// TestLeasedReshardUnderLoad: the slot of the global subject moves from one master to another
// (redis-cli --cluster reshard) while three engines decide a allotted rule's checks, allotting as
// they go. No check fails or is degraded, and once the engines close (giving back what they
// hold) the window's counter is exactly the checks admitted: no allotment was lost or counted
// twice by a redirection.
func TestLeasedReshardUnderLoad(t *testing.T) {
	t.Parallel()
	cl, err := redistest.StartCluster(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ep := leaseEndpoint(t)
	key := windowKey(ep)
	set := mustRules(t, fmt.Sprintf(`rules:
  - {id: hot, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 1000000000, window: 1h, lease: {slice: 20}}
`, ep))
	engines := make([]*Engine, 3)
	for i := range engines {
		engines[i] = New(Config{Redis: clusterClient(t, cl), Rules: set, RedisTimeout: 5 * time.Second, Logger: checkertest.Logger()})
	}
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			for _, e := range engines {
				e.Close()
			}
		}
	}
	defer closeAll()

	// Move the global slot: redis-cli moves a master's lowest slots first, so move all of its
	// slots up to that one.
	rdb := clusterClient(t, cl)
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	owners, err := cl.SlotOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	from, lo := owners[slot], int(slot)
	for lo > 0 && owners[lo-1] == from {
		lo--
	}
	to := ""
	for _, o := range owners {
		if o != from {
			to = o
			break
		}
	}

	hour := time.Now().Truncate(time.Hour)
	var checks, allowed, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			e := engines[w%3]
			for {
				select {
				case <-stop:
					return
				default:
				}
				out, err := e.Check(ctx, userQuery("u", ep))
				checks.Add(1)
				switch {
				case err != nil || out.Degraded:
					failed.Add(1)
				case out.Allowed:
					allowed.Add(1)
				}
				time.Sleep(200 * time.Microsecond)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	before := checks.Load()
	if err := cl.Reshard(ctx, from, to, int(slot)-lo+1); err != nil {
		t.Error(err)
	}
	during := checks.Load() - before
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if owner, err := cl.MasterOf(ctx, key); err != nil || owner.Addr != to {
		t.Fatalf("after the reshard %s is on %v (%v), want %s", key, owner, err, to)
	}
	closeAll()
	t.Logf("%d checks during the reshard, %d in all, %d admitted, %d failed or degraded", during, checks.Load(), allowed.Load(), failed.Load())
	if during == 0 {
		t.Error("no check ran during the reshard")
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d checks failed or were degraded during the reshard", n)
	}
	if time.Now().Truncate(time.Hour) != hour {
		t.Skip("the hour turned during the test: two windows")
	}
	n, err := rdb.HGet(ctx, key, "n").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if n != allowed.Load() {
		t.Errorf("window counter after the engines gave their slices back: got %d, want the %d admitted", n, allowed.Load())
	}
}
