package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// leaseCounter reads the window counter of the leased rule at endpoint on the topology named.
func leaseCounter(t *testing.T, topo, endpoint string) int64 {
	t.Helper()
	var rdb redis.UniversalClient
	switch topo {
	case "standalone":
		rdb = redisSrv.Client(4)
	case "cluster":
		rdb = sharedCluster(t).Client()
	case "sentinel":
		rdb = sharedSentinel(t).Client()
	default:
		t.Fatalf("no client for topology %q", topo)
	}
	defer rdb.Close()
	n, err := rdb.HGet(context.Background(), "rl:{global}:fw:1h:"+endpoint, "n").Int64()
	if err != nil {
		t.Fatalf("counter of %s: %v", endpoint, err)
	}
	return n
}

// leaseLoad counts what a load of leased checks saw.
type leaseLoad struct {
	allowed, denied, failed atomic.Int64
}

// hotCheck is a check of the global rules at endpoint, as a gateway sends them: for a user
// whom no rule counts.
func hotCheck(endpoint string, i int) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
	return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: fmt.Sprintf("u%d", i%100), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint})
}

// drive sends checks from workers goroutines to c until each has sent n, or has seen a
// denial when n is 0, or until stop is closed; errors and degraded answers count as failed.
func (ld *leaseLoad) drive(c quotaflowv1connect.RateLimiterClient, endpoint string, workers, n int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; n == 0 || i < n; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.CheckRateLimit(context.Background(), hotCheck(endpoint, w*n+i))
				switch {
				case err != nil || resp.Msg.Degraded:
					ld.failed.Add(1)
				case resp.Msg.Allowed:
					ld.allowed.Add(1)
				default:
					ld.denied.Add(1)
					if n == 0 {
						return
					}
				}
			}
		})
	}
	return &wg
}

// TestLeasedAcrossProcesses: three checker processes share a leased global rule (issue 22,
// item 3) on one Redis — a server, a cluster or a Sentinel group. Three times the limit in
// concurrent checks, a third on each, admit exactly the limit: each process uses every unit it
// leased. Then, on another rule, one process is killed (kill -9) under load and the other two
// are driven until they deny: never more than the limit is admitted, and what the dead one
// held is lost, at most its slice and the checks it admitted whose answers it never sent.
func TestLeasedAcrossProcesses(t *testing.T) {
	t.Parallel()
	const limit, slice, workers = 3000, 100, 16
	for _, topo := range redisTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			ep := fmt.Sprintf("/hot/%s/%d", topo.name, time.Now().UnixNano())
			rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
			doc := fmt.Sprintf(`rules:
- {id: exact, dimension: global, endpoint: %q, algorithm: fixed_window, limit: %d, window: 1h, lease: {slice: %d}}
- {id: kill, dimension: global, endpoint: %q, algorithm: fixed_window, limit: %d, window: 1h, lease: {slice: %d}}
`, ep+"/exact", limit, slice, ep+"/kill", limit, slice)
			if err := os.WriteFile(rulesPath, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			var procs []*checkerProcess
			var clients []quotaflowv1connect.RateLimiterClient
			for range 3 {
				p := startCheckerProcess(t, append([]string{"--rules", rulesPath}, topo.flags(t)...)...)
				procs = append(procs, p)
				clients = append(clients, quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, p.url))
			}
			hour := time.Now().Truncate(time.Hour)
			t.Run("exact", func(t *testing.T) {
				var ld leaseLoad
				var runs []*sync.WaitGroup
				for _, c := range clients {
					runs = append(runs, ld.drive(c, ep+"/exact", workers, limit/workers+1, nil))
				}
				for _, wg := range runs {
					wg.Wait()
				}
				if time.Now().Truncate(time.Hour) != hour {
					t.Skip("the hour turned during the test: two windows")
				}
				if n := ld.failed.Load(); n > 0 {
					t.Fatalf("%d checks failed or were degraded", n)
				}
				if got := ld.allowed.Load(); got != limit {
					t.Errorf("%d checks over 3 processes admitted %d, want exactly the limit %d", ld.allowed.Load()+ld.denied.Load(), got, limit)
				}
				if got := leaseCounter(t, topo.name, ep+"/exact"); got != limit {
					t.Errorf("window counter: got %d, want %d leased", got, limit)
				}
			})
			t.Run("kill -9", func(t *testing.T) {
				var ld, dead leaseLoad
				stop := make(chan struct{})
				doomed := dead.drive(clients[0], ep+"/kill", workers, 0, stop)
				var survivors []*sync.WaitGroup
				for _, c := range clients[1:] {
					survivors = append(survivors, ld.drive(c, ep+"/kill", workers, limit/6/workers, nil))
				}
				for _, wg := range survivors {
					wg.Wait()
				}
				// A third of the limit went through the survivors, about a sixth through the
				// third process: kill it under load, with its slice in hand.
				procs[0].kill()
				close(stop)
				doomed.Wait()
				for _, c := range clients[1:] {
					survivors = append(survivors, ld.drive(c, ep+"/kill", workers, 0, nil))
				}
				for _, wg := range survivors {
					wg.Wait()
				}
				if time.Now().Truncate(time.Hour) != hour {
					t.Skip("the hour turned during the test: two windows")
				}
				if n := ld.failed.Load(); n > 0 {
					t.Fatalf("%d checks of the surviving processes failed or were degraded", n)
				}
				got := ld.allowed.Load() + dead.allowed.Load()
				lost := limit - got
				t.Logf("admitted %d of %d (%d by the killed process); lost to the kill: %d", got, limit, dead.allowed.Load(), lost)
				if got > limit {
					t.Errorf("admitted %d across the kill, more than the limit %d", got, limit)
				}
				// Lost: the killed process's slice, and the checks it admitted as it died
				// (at most one per worker) whose answers never left.
				if lost > slice+workers {
					t.Errorf("lost %d units to the kill, want at most the slice %d and %d in flight", lost, slice, workers)
				}
				if got := leaseCounter(t, topo.name, ep+"/kill"); got != limit {
					t.Errorf("window counter: got %d, want %d leased", got, limit)
				}
			})
		})
	}
}
