package checker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// failoverTopology is a Redis with a replica to promote: a cluster or a Sentinel group.
type failoverTopology struct {
	name  string
	start func(t *testing.T) (cfg bucket.RedisConfig, killMaster func(ctx context.Context, key string) (wait func(ctx context.Context) error))
}

var failoverTopologies = []failoverTopology{
	{"cluster", func(t *testing.T) (bucket.RedisConfig, func(context.Context, string) func(context.Context) error) {
		cl, err := redistest.StartCluster(3, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return bucket.RedisConfig{Cluster: cl.Seeds()}, func(ctx context.Context, key string) func(context.Context) error {
			m, err := cl.MasterOf(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			m.Kill()
			return cl.WaitHealthy
		}
	}},
	{"sentinel", func(t *testing.T) (bucket.RedisConfig, func(context.Context, string) func(context.Context) error) {
		sg, err := redistest.StartSentinel(2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sg.Close)
		return bucket.RedisConfig{Sentinels: sg.SentinelAddrs, MasterName: sg.MasterName}, func(ctx context.Context, _ string) func(context.Context) error {
			m, err := sg.Master(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m.Kill()
			return func(ctx context.Context) error { _, err := sg.WaitFailover(ctx, m.Addr); return err }
		}
	}},
}

// TestFailover: with the master of a subject's buckets killed under load (about 4,000 checks/s),
// every check is answered within its deadline — by the rule's fail mode, reported degraded,
// while no master owns the key — and once the replica is promoted checks are exact again
// without a new engine. It counts the charges the promotion lost (replication is
// asynchronous; docs/scaling.md).
func TestFailover(t *testing.T) {
	t.Parallel()
	for _, topo := range failoverTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			testFailover(t, topo)
		})
	}
}

func testFailover(t *testing.T, topo failoverTopology) {
	cfg, killMaster := topo.start(t)
	rdb, err := bucket.NewRedisClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	e := New(Config{Redis: rdb, Rules: mustRules(t, `
rules:
  - {id: big, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 1000000, window: 1h}
`), RedisTimeout: 200 * time.Millisecond, ProbeInterval: 100 * time.Millisecond, Logger: checkertest.Logger()})
	defer e.Close()
	user := "failover-user"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var answered, degraded, exact, errs, slow atomic.Int64
	// A degraded check may still have charged: one the old master ran and replicated but died
	// before answering, or one that timed out waiting for a reply. These are the unknown
	// outcomes any timeout has; the degraded checks are kept to count them.
	var mu sync.Mutex
	var spans [][2]time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				out, err := e.Check(context.Background(), userQuery(user, "/x"))
				end := time.Now()
				if end.Sub(start) > 2*time.Second { // ten times the Redis deadline: a loaded CI machine's margin
					slow.Add(1)
				}
				switch {
				case err != nil:
					errs.Add(1)
				case out.Degraded:
					degraded.Add(1)
					answered.Add(1)
					mu.Lock()
					spans = append(spans, [2]time.Time{start, end})
					mu.Unlock()
				default:
					answered.Add(1)
					exact.Add(1) // allowed (the limit is far) and charged on a master
				}
				time.Sleep(time.Millisecond) // about 4,000 checks/s in all
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	killing := time.Now()
	wait := killMaster(ctx, "rl:{user:"+user+"}:fw:1h:/x")
	killed := time.Now()
	if err := wait(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killed)
	var exactAgain time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err := e.Check(context.Background(), userQuery(user, "/x"))
		if err == nil && !out.Degraded {
			exactAgain = time.Since(killed)
			exact.Add(1)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checks not exact 30s after the failover: %v %v", out, err)
		}
	}
	close(stop)
	wg.Wait()
	// Replication is asynchronous: charges the old master acknowledged but had not sent to its
	// replica are gone after the promotion (docs/scaling.md).
	peek, err := e.Peek(context.Background(), userQuery(user, "/x"))
	if err != nil || peek.Degraded {
		t.Fatalf("peek after the failover: %v, %v", peek, err)
	}
	unknown := 0
	for _, s := range spans {
		inFlight := s[0].Before(killed) && s[1].After(killing)
		if inFlight || s[1].Sub(s[0]) >= 200*time.Millisecond { // the Redis deadline
			unknown++
		}
	}
	lost := exact.Load() - peek.DecidingLimit().Result.Used
	t.Logf("promoted after %v, exact again after %v; answered %d (degraded %d, of which %d may have charged), errors %d, slower than 2s %d; exact charges %d, lost in the failover %d",
		promoted, exactAgain, answered.Load(), degraded.Load(), unknown, errs.Load(), slow.Load(), exact.Load(), lost)
	if lost < -int64(unknown) {
		t.Errorf("the counter holds %d more charges than the exact checks made, and only %d degraded checks may have charged", -lost, unknown)
	}
	if errs.Load() != 0 || slow.Load() != 0 {
		t.Errorf("%d checks failed and %d took over 2s during the failover, want every one answered within its deadline", errs.Load(), slow.Load())
	}
	if err := e.Ready(context.Background()); err != nil {
		t.Errorf("Ready after the failover = %v, want nil", err)
	}
}

// TestClusterBalance: the buckets of 10,000 users spread over a 3-master cluster within ±15 % of
// an even share, each user's keys on one master (docs/scaling.md).
func TestClusterBalance(t *testing.T) {
	t.Parallel()
	cl, err := redistest.StartCluster(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	rdb := cl.Client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	owner, err := cl.SlotOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const users = 10000
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, users)
	for i := range users {
		cmds[i] = pipe.ClusterKeySlot(ctx, limitKey(subjectTag(1, "user-"+strconv.Itoa(i)), &rules.Rule{Algorithm: algorithm.TokenBucket, Window: time.Minute, Endpoint: "/api/*"}))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	perMaster := map[string]int{}
	for _, c := range cmds {
		perMaster[owner[c.Val()]]++
	}
	even := float64(users) / 3
	for m, n := range perMaster {
		if dev := (float64(n) - even) / even; dev > 0.15 || dev < -0.15 {
			t.Errorf("master %s holds %d of %d users' buckets, %.1f %% off an even share", m, n, users, 100*dev)
		}
	}
	if len(perMaster) != 3 {
		t.Errorf("users' buckets on %d masters, want 3: %v", len(perMaster), perMaster)
	}
	t.Logf("buckets per master: %v (even share %.0f)", perMaster, even)
}

// TestFailoverIdleChecker: a checker that sat idle while the master of a user's slot was killed
// and its replica promoted still holds the old slot map; its first calls are refused by the dead
// master. Those calls never ran, so it reloads the slot map and sends them to the new master
// within the check's deadline: a burst of 100 concurrent checks spread over three checkers
// against a limit of 20 admits exactly 20, none degraded, and the refused calls count as no
// failure towards the idle checker's circuit (docs/scaling.md). Before, on the cluster, the idle
// checker's third of the burst was answered by the fail mode (open): 53 admitted. A Sentinel
// client learns the new master from the sentinels, idle or not; the case keeps it so.
func TestFailoverIdleChecker(t *testing.T) {
	t.Parallel()
	for _, topo := range failoverTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			testFailoverIdleChecker(t, topo)
		})
	}
}

func testFailoverIdleChecker(t *testing.T, topo failoverTopology) {
	cfg, killMaster := topo.start(t)
	set := mustRules(t, `
rules:
  - {id: load, dimension: user, endpoint: /load, algorithm: fixed_window, limit: 1000000, window: 1h}
  - {id: burst, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 20, window: 1h}
`)
	// Each checker has its own cluster client, hence its own slot map, as separate processes do.
	engines := make([]*Engine, 3)
	for i := range engines {
		rdb, err := bucket.NewRedisClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Close() })
		// A deadline far above any round trip: on a loaded machine no check may fall to its fail
		// mode for being slow, only for Redis being unreachable.
		engines[i] = New(Config{Redis: rdb, Rules: set, RedisTimeout: 5 * time.Second, ProbeInterval: 100 * time.Millisecond, Logger: checkertest.Logger()})
		t.Cleanup(func() { engines[i].Close() })
	}
	busy, idle := engines[:2], engines[2]
	const user = "idle-failover-user"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Every checker learns the slot map and connects to the user's master before the kill.
	for i, e := range engines {
		if out, err := e.Check(ctx, userQuery(user, "/load")); err != nil || out.Degraded || !out.Allowed {
			t.Fatalf("checker %d before the failover: %+v, %v", i, out, err)
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, e := range busy {
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = e.Check(ctx, userQuery(user, "/load")) // degraded while no master serves the slot
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wait := killMaster(ctx, "rl:{user:"+user+"}:fw:1h:/x")
	if err := wait(ctx); err != nil {
		t.Fatal(err)
	}
	// The busy checkers follow the promotion through their own traffic; wait until each decides
	// exactly again (its circuit, opened while the slot had no master, closed by a probe).
	for i, e := range busy {
		for {
			out, err := e.Check(ctx, userQuery(user, "/load"))
			if err == nil && !out.Degraded {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("busy checker %d not exact after the failover: %+v, %v", i, out, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()

	const checks = 100
	var admitted, degraded, errs atomic.Int64
	start := make(chan struct{})
	var burst sync.WaitGroup
	for i := range checks {
		e := engines[i%len(engines)]
		burst.Go(func() {
			<-start
			out, err := e.Check(ctx, userQuery(user, "/x"))
			switch {
			case err != nil:
				errs.Add(1)
				t.Errorf("check: %v", err)
			case out.Degraded:
				degraded.Add(1)
			}
			if err == nil && out.Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	burst.Wait()
	t.Logf("burst of %d checks against a limit of 20 after the failover: %d admitted, %d degraded, %d errors", checks, admitted.Load(), degraded.Load(), errs.Load())
	if got := admitted.Load(); got != 20 {
		t.Errorf("admitted %d of %d checks against a limit of 20, want 20", got, checks)
	}
	if got := degraded.Load(); got != 0 {
		t.Errorf("%d checks decided by the fail mode after the cluster was healthy again, want 0", got)
	}
	if n := idle.guard.circuit.failures.Load(); n != 0 || idle.guard.circuit.open() {
		t.Errorf("idle checker's circuit: %d failures counted, open %t; want 0, closed: a refused call that was re-sent is no failure", n, idle.guard.circuit.open())
	}
}
