package checker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// reshardRules: /r has three limits of which the 25-per-day window denies first; /big never
// denies, so that every check charges and the counters can be compared with the answers.
const reshardRules = `
rules:
  - {id: fw, dimension: user, endpoint: /r, algorithm: fixed_window, limit: 25, window: 24h}
  - {id: tb, dimension: user, endpoint: /r, algorithm: token_bucket, limit: 40, window: 24h}
  - {id: swl, dimension: user, endpoint: /r, algorithm: sliding_window_log, limit: 50, window: 24h}
  - {id: big-fw, dimension: user, endpoint: /big, algorithm: fixed_window, limit: 1000000, window: 24h}
  - {id: big-swl, dimension: user, endpoint: /big, algorithm: sliding_window_log, limit: 1000000, window: 24h}
`

// reshardUser is what the load did to one user.
type reshardUser struct {
	name, endpoint              string
	attempts, allowed, replayed atomic.Int64
}

// TestReshardUnderLoad: the slots holding the buckets of users under load move from one master
// to another (redis-cli --cluster reshard, one key per MIGRATE, so that a user's keys are split
// between the two masters for a while) as checks run. No check fails or is degraded; users with
// room hold exactly the charges they were allowed, once each (retries of an allowed check, with
// its idempotency key, replay without a charge; a denial's retry is decided afresh); users past
// their limit were admitted exactly the limit.
func TestReshardUnderLoad(t *testing.T) {
	t.Parallel()
	cl, err := redistest.StartCluster(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	rdb := clusterClient(t, cl)
	met := &redirects{}
	rdb.OnNewNode(func(n *redis.Client) { n.AddHook(met) })
	e := New(Config{Redis: rdb, Rules: mustRules(t, reshardRules), RedisTimeout: 5 * time.Second, Logger: checkertest.Logger()})
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The slots to move: the first 1,000, owned by one master.
	const moved = 1000
	owners, err := cl.SlotOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	from, to, first := owners[0], "", 0
	for _, o := range owners {
		if o != from {
			to = o
			break
		}
	}
	if owners[moved-1] != from || to == "" {
		t.Fatalf("slots 0-%d are not all one master's: %s ... %s", moved-1, owners[0], owners[moved-1])
	}
	users := usersInSlots(t, ctx, rdb, first, first+moved, 120)
	// Each loaded slot gets keys of its own beside the buckets, which redis-cli moves one per
	// MIGRATE: the slot is in migration for as long (tens of ms), so that the checks of its
	// user meet it there. With only the buckets' few keys a slot moved in well under a
	// millisecond, and on a loaded machine a whole reshard could pass without one check
	// meeting a slot in migration (the test then failed its own premise, never a check).
	padSlots(t, ctx, rdb, users, 100)
	var load []*reshardUser
	for i, u := range users {
		ep := "/r"
		if i%2 == 1 {
			ep = "/big"
		}
		load = append(load, &reshardUser{name: u, endpoint: ep})
	}

	var checks, failed, degraded, badReplay atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				u := load[rng.IntN(len(load))]
				q := userQuery(u.name, u.endpoint)
				q.IdempotencyKey = fmt.Sprintf("w%d-%d", w, n)
				tries := 1
				if n%4 == 0 {
					tries = 2 // a retry of the same check: an allowed one is replayed, never charged again
				}
				var first *Outcome
				for try := range tries {
					out, err := e.Check(ctx, q)
					checks.Add(1)
					switch {
					case err != nil:
						failed.Add(1)
						t.Errorf("check of %s: %v", u.name, err)
						return
					case out.Degraded:
						degraded.Add(1)
					case try == 0:
						first = out
						u.attempts.Add(1)
						if out.Allowed {
							u.allowed.Add(1)
						}
					case first.Allowed && (!out.Replayed || !out.Allowed):
						badReplay.Add(1)
					case first.Allowed:
						u.replayed.Add(1)
					case out.Replayed:
						badReplay.Add(1) // a denied check leaves no record
					default:
						// The retry of a denial is decided afresh: a check of its own.
						u.attempts.Add(1)
						if out.Allowed {
							u.allowed.Add(1)
						}
					}
				}
				time.Sleep(500 * time.Microsecond)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	start, before := time.Now(), checks.Load()
	if err := cl.Reshard(ctx, from, to, moved); err != nil {
		t.Error(err)
	}
	took, during := time.Since(start), checks.Load()-before
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if owner, err := cl.MasterOf(ctx, "rl:{user:"+users[0]+"}:fw:1d:/r"); err != nil || owner.Addr != to {
		t.Fatalf("after the reshard %s's keys are on %v (%v), want %s", users[0], owner, err, to)
	}

	t.Logf("reshard of %d slots took %v with %d checks during it; %d checks in all, %d failed, %d degraded, %d replays wrong",
		moved, took, during, checks.Load(), failed.Load(), degraded.Load(), badReplay.Load())
	t.Logf("replies met: %d MOVED, %d ASK, %d TRYAGAIN", met.moved.Load(), met.ask.Load(), met.tryAgain.Load())
	if met.ask.Load()+met.tryAgain.Load() == 0 {
		t.Error("no check met the slots in migration (no ASK, no TRYAGAIN): the test moved nothing under load")
	}
	for _, u := range load {
		peek, err := e.Peek(ctx, userQuery(u.name, u.endpoint))
		if err != nil || peek.Degraded {
			t.Fatalf("peek of %s: %v %v", u.name, peek, err)
		}
		attempts, allowed := u.attempts.Load(), u.allowed.Load()
		if u.endpoint == "/r" {
			if want := min(attempts, 25); allowed != want {
				t.Errorf("%s: %d of %d checks admitted, want %d", u.name, allowed, attempts, want)
			}
		} else if allowed != attempts {
			t.Errorf("%s: %d of %d checks admitted below the limit", u.name, allowed, attempts)
		}
		for _, l := range peek.Limits {
			if l.Rule.ID == "fw" || l.Rule.ID == "big-fw" || l.Rule.ID == "big-swl" {
				if got := l.Result.Used; got != allowed {
					t.Errorf("%s %s: %d charges held for %d admitted checks", u.name, l.Rule.ID, got, allowed)
				}
			}
		}
	}
	if degraded.Load() != 0 || badReplay.Load() != 0 {
		t.Errorf("%d checks degraded and %d retries not replayed during the reshard, want none", degraded.Load(), badReplay.Load())
	}
}

// clusterClient is a client of cl configured as the checker configures its clients, closed
// with the test.
func clusterClient(t *testing.T, cl *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	rdb, err := bucket.NewRedisClient(bucket.RedisConfig{Cluster: cl.Seeds()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb.(*redis.ClusterClient)
}

// usersInSlots returns n user names whose buckets hash to slots in [lo, hi).
func usersInSlots(t *testing.T, ctx context.Context, rdb *redis.ClusterClient, lo, hi, n int) []string {
	t.Helper()
	const candidates = 40000
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, candidates)
	for i := range candidates {
		cmds[i] = pipe.ClusterKeySlot(ctx, fmt.Sprintf("{user:reshard-%d}", i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var users []string
	for i, c := range cmds {
		if s := int(c.Val()); lo <= s && s < hi && len(users) < n {
			users = append(users, fmt.Sprintf("reshard-%d", i))
		}
	}
	if len(users) < n {
		t.Fatalf("%d of %d candidate users hash to slots %d-%d, want %d", len(users), candidates, lo, hi-1, n)
	}
	return users
}

// redirects is a go-redis hook on every node of a cluster client counting the replies that
// say a slot is moving or has moved.
type redirects struct{ moved, ask, tryAgain atomic.Int64 }

func (h *redirects) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *redirects) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *redirects) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			switch e := c.Err(); {
			case e == nil:
			case redis.HasErrorPrefix(e, "MOVED"):
				h.moved.Add(1)
			case redis.HasErrorPrefix(e, "ASK"):
				h.ask.Add(1)
			case redis.HasErrorPrefix(e, "TRYAGAIN"):
				h.tryAgain.Add(1)
			}
		}
		return err
	}
}

// TestMasterDownMidCheck: a check whose subjects live on two masters, one of which fails. The
// living master charges its subject, the other's call fails, the check is answered by the fail
// mode, and the living master's charge is refunded: no charge leaks. The master fails in two
// ways: it stops answering (CLIENT PAUSE: the check's deadline passes, and the refund runs in
// the background), then it dies (kill -9: its connection is refused at once).
func TestMasterDownMidCheck(t *testing.T) {
	t.Parallel()
	cl, err := redistest.StartCluster(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range cl.Nodes() {
		// The living masters keep serving their slots while one master is down, as a cluster
		// configured for availability does; with full coverage required they would refuse every
		// call after cluster-node-timeout, and nothing would be charged to leak.
		c := n.Client()
		err := c.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	rdb := clusterClient(t, cl)
	const ip = "192.0.2.77"
	ipMaster, err := cl.MasterOf(ctx, "rl:{ip:"+ip+"}:fw:1h:/x")
	if err != nil {
		t.Fatal(err)
	}
	user, userKey := "", ""
	var userMaster *redistest.Node
	for i := 0; user == ""; i++ {
		u := fmt.Sprintf("midcheck-%d", i)
		k := "rl:{user:" + u + "}:swl:1h:/x"
		m, err := cl.MasterOf(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if m.Addr != ipMaster.Addr {
			user, userKey, userMaster = u, k, m
		}
	}
	node := userMaster.Client()
	defer node.Close()
	q := &Query{Subjects: []Subject{{Dimension: 1, ID: user}, {Dimension: 2, ID: ip}}, Endpoint: "/x", Cost: 1}

	charged := int64(0) // the charges the user's bucket holds
	for _, failure := range []struct {
		name string
		fail func() error
	}{
		{"stops answering", func() error {
			c := ipMaster.Client()
			defer c.Close()
			return c.Do(ctx, "CLIENT", "PAUSE", 1500, "ALL").Err()
		}},
		{"dies", func() error { ipMaster.Kill(); return nil }},
	} {
		// A new engine each time: the failure opened the circuit of the one before.
		e := New(Config{Redis: rdb, Rules: mustRules(t, `
rules:
  - {id: user-log, dimension: user, endpoint: /x, algorithm: sliding_window_log, limit: 100, window: 1h}
  - {id: ip-fw, dimension: ip, endpoint: /x, algorithm: fixed_window, limit: 100, window: 1h}
`), RedisTimeout: 300 * time.Millisecond, Logger: checkertest.Logger()})
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			out, err := e.Check(ctx, q) // both masters up: after a pause, once it has ended
			if err == nil && out.Allowed && !out.Degraded {
				charged++
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: checks not exact with both masters up: %v, %v", failure.name, out, err)
			}
		}
		before := scriptCalls(t, ctx, userMaster.Client())
		if err := failure.fail(); err != nil {
			t.Fatal(err)
		}
		out, err := e.Check(ctx, q)
		if err != nil || !out.Degraded || !out.Allowed {
			t.Fatalf("%s: check with the IP's master failed: %+v, %v; want allowed by fail mode open, degraded", failure.name, out, err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			n, err := node.ZCard(ctx, userKey).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == charged {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s holds %d charges 5s after a check that failed on another master, want %d", failure.name, userKey, n, charged)
			}
		}
		if calls := scriptCalls(t, ctx, userMaster.Client()) - before; calls < 2 {
			t.Errorf("%s: the user's master ran %d script calls for the failed check, want the charge and its refund", failure.name, calls)
		}
		e.Close()
	}
}

// scriptCalls is the number of script calls a server has run.
func scriptCalls(t *testing.T, ctx context.Context, c *redis.Client) int64 {
	t.Helper()
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\r\n") {
		name, val, _ := strings.Cut(line, ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(val, "calls="), ",")
		c, _ := strconv.ParseInt(calls, 10, 64)
		n += c
	}
	return n
}

// padSlots writes n keys of no bucket into the slot of each user (its hash tag), so that
// moving the slot takes n MIGRATEs.
func padSlots(t *testing.T, ctx context.Context, rdb redis.UniversalClient, users []string, n int) {
	t.Helper()
	for _, u := range users {
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range n {
				p.Set(ctx, "pad:{user:"+u+"}:"+strconv.Itoa(i), "x", 0)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}
