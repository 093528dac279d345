package bucket

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// pipelineCounter is a go-redis hook counting the pipelines of script calls and the calls
// they carry.
type pipelineCounter struct {
	pipelines, cmds atomic.Int64
}

func (h *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := 0
		for _, c := range cmds {
			scripts += scriptCalls(c)
		}
		if scripts > 0 { // not a connection's set-up
			h.pipelines.Add(1)
			h.cmds.Add(int64(scripts))
		}
		return next(ctx, cmds)
	}
}

// scriptCalls is the number of check script calls cmd carries: the number of calls of a batch
// script or function call, one for a check script call, none for another command.
func scriptCalls(cmd redis.Cmder) int {
	name := cmd.Name()
	if name != "evalsha" && name != "eval" && name != "fcall" {
		return 0
	}
	args := cmd.Args()
	if len(args) > 3 && (name == "fcall" || slices.ContainsFunc(batchScripts[:], func(s *script) bool { return args[1] == s.sha || args[1] == s.src })) {
		if m, ok := args[3].(int64); ok {
			return int(m)
		}
	}
	return 1
}

// countPipelines counts the pipelines c sends to its server, or to each master of a cluster.
func countPipelines(c redis.UniversalClient) *pipelineCounter {
	hook := &pipelineCounter{}
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(hook) })
	} else {
		c.AddHook(hook)
	}
	return hook
}

// hammer runs calls Checks of req from as many goroutines, released together, and returns
// how many were allowed and how many failed.
func hammer(s *Store, calls int, req Request) (allowed, failed int64) {
	var a, f atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range calls {
		wg.Go(func() {
			<-start
			res, err := s.Check(context.Background(), []Request{req})
			switch {
			case err != nil:
				f.Add(1)
			case res[0].Allowed:
				a.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return a.Load(), f.Load()
}

// TestStoreBatchExact: 1000 concurrent Checks through one Store's batcher race on one key
// with limit 100; exactly 100 get through, and they travelled in far fewer pipelines.
func TestStoreBatchExact(t *testing.T) {
	t.Parallel()
	const L, calls = 100, 1000
	tests := []struct {
		alg algorithm.ID
		cfg StoreConfig
	}{
		{algorithm.FixedWindow, StoreConfig{}},
		{algorithm.TokenBucket, StoreConfig{}},
		{algorithm.GCRA, StoreConfig{}},
		{algorithm.SlidingWindowLog, StoreConfig{}},
		{algorithm.SlidingWindowCounter, StoreConfig{Loops: 1, MaxBatch: 7}},
		{algorithm.LeakyBucket, StoreConfig{Loops: 16, MaxBatch: 1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/loops=%d/max=%d", tt.alg, tt.cfg.Loops, tt.cfg.MaxBatch), func(t *testing.T) {
			t.Parallel()
			c := client(t)
			hook := countPipelines(c)
			// A batch's own deadline (1s by default) that a loaded CI machine running 1000
			// goroutines and the rest of the suite does not outlast: exactness is the test.
			tt.cfg.BatchTimeout = 30 * time.Second
			s := NewStoreWithConfig(c, tt.cfg)
			t.Cleanup(func() { s.Close() })
			allowed, failed := hammer(s, calls, one(lim(key(t, "b"), tt.alg, L, long, 0), 1))
			if allowed != L || failed != 0 {
				t.Errorf("got %d allowed and %d errors of %d checks, want exactly %d allowed", allowed, failed, calls, L)
			}
			if p, n := hook.pipelines.Load(), hook.cmds.Load(); n < calls || (tt.cfg.MaxBatch != 1 && p >= calls) {
				t.Errorf("%d checks in %d pipelines of %d commands: not batched", calls, p, n)
			} else {
				t.Logf("%d checks in %d pipelines", calls, p)
			}
		})
	}
}

// TestStoreBatchPerServer: concurrent Checks of many subjects travel in few pipelines per
// server; on a cluster, one pipeline per master of each batch, each carrying the calls of the
// slots the master owns, and every call sent once.
func TestStoreBatchPerServer(t *testing.T) {
	t.Parallel()
	const subjects = 600
	c := client(t)
	var mu sync.Mutex
	perServer := map[string]*pipelineCounter{}
	count := func(addr string) *pipelineCounter {
		mu.Lock()
		defer mu.Unlock()
		if perServer[addr] == nil {
			perServer[addr] = &pipelineCounter{}
		}
		return perServer[addr]
	}
	servers := 1
	if cc, ok := c.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(count(n.Options().Addr)) })
		servers = 3
	} else {
		c.AddHook(count("server"))
	}
	s := NewStoreWithConfig(c, storeConfig(StoreConfig{}))
	t.Cleanup(func() { s.Close() })
	if err := s.LoadScript(ctxT(t)); err != nil { // so that no call meets NOSCRIPT and is sent again
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := make(chan struct{})
	run := time.Now().UnixNano()
	for i := range subjects {
		wg.Go(func() {
			<-start
			k := fmt.Sprintf("{per-server-%d-%d}:b", run, i) // a subject of its own: a slot of its own
			if _, err := s.Check(context.Background(), []Request{one(lim(k, algorithm.FixedWindow, 10, long, 0), 1)}); err != nil {
				failed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d checks failed", failed.Load(), subjects)
	}
	var cmds int64
	used := 0
	for addr, h := range perServer {
		p, n := h.pipelines.Load(), h.cmds.Load()
		if n == 0 {
			continue // a replica
		}
		used++
		cmds += n
		if p >= n {
			t.Errorf("%s: %d calls in %d pipelines: not batched", addr, n, p)
		}
		t.Logf("%s: %d calls in %d pipelines", addr, n, p)
	}
	if used != servers || cmds != subjects {
		t.Errorf("%d calls over %d servers, want each of %d calls sent once over %d", cmds, used, subjects, servers)
	}
}

// TestStoreConfig: the zero config and out-of-range values mean the defaults; a Check of more
// requests than MaxBatch travels whole; Close stops the Store.
func TestStoreConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []StoreConfig{{}, {Loops: -1, MaxBatch: -5, BatchTimeout: -time.Second}} {
		got := cfg.withDefaults()
		if got.Loops != defaultLoops || got.MaxBatch != defaultMaxBatch || got.BatchTimeout != defaultBatchTimeout || got.OnRoundTrip != nil {
			t.Errorf("%+v with defaults: got %+v", cfg, got)
		}
	}
	c := client(t)
	s := NewStoreWithConfig(c, StoreConfig{Loops: 1, MaxBatch: 2})
	reqs := make([]Request, 5)
	for i := range reqs {
		reqs[i] = one(lim(key(t, fmt.Sprint(i)), algorithm.FixedWindow, 5, long, 0), 1)
	}
	res, err := s.Check(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("Check of %d requests with MaxBatch 2: %v", len(reqs), err)
	}
	for i, r := range res {
		if !r.Allowed || r.Limits[0].Remaining != 4 {
			t.Errorf("request %d: got allowed %v remaining %d, want true 4", i, r.Allowed, r.Limits[0].Remaining)
		}
	}
	s.Close()
	s.Close()
	if _, err := s.Check(ctxT(t), reqs[:1]); !errors.Is(err, ErrStoreClosed) {
		t.Errorf("Check after Close: got %v, want ErrStoreClosed", err)
	}
}

// TestStoreCloseWaits: Close returns once the Store's goroutines have stopped, a batch in
// flight included, so that an owner's Close leaves nothing running. The Redis here accepts
// connections and never answers: the loop is in its pipeline until BatchTimeout. Not parallel:
// it counts the process's batch loops.
func TestStoreCloseWaits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	})
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })

	before := proctest.Goroutines(batchLoop)
	s := NewStoreWithConfig(rdb, StoreConfig{Loops: 1, BatchTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Check(ctx, []Request{one(lim("rl:{close}:x", algorithm.FixedWindow, 5, long, 0), 1)})
		done <- err
	}()
	accepted <- <-accepted // the loop is sending its batch
	cancel()
	<-done
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := proctest.Goroutines(batchLoop); got != before {
		t.Errorf("after Close: %d loops running, want %d: Close returned before its goroutines stopped", got, before)
	}
}

// TestStoreNoScriptUnderLoad: SCRIPT FLUSH and FUNCTION FLUSH while checks are in flight. The
// batches that meet a missing function load the library and call it again; those that meet
// NOSCRIPT (the batch script's, once Redis refused the library) re-send with EVAL. No call
// fails, and no charge is lost or doubled. Each case has its own server: flushing the shared
// one would race the other tests' script checks.
func TestStoreNoScriptUnderLoad(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		noLib bool   // the Store has met Redis's refusal of the library
		stat  string // the command whose calls prove the re-sends
	}{
		{"library", false, "cmdstat_function|load:"},
		{"batch script", true, "cmdstat_eval:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			own, c, s := ownStore(t, StoreConfig{})
			s.b.noLib.Store(tt.noLib)
			flushes := flushUnderLoad(t, own.Client(0), s)
			if !strings.Contains(c.Info(ctxT(t), "commandstats").Val(), tt.stat) {
				t.Errorf("no %s during %d flushes: the flushes never met a batch", tt.stat, flushes)
			} else {
				t.Logf("%d flushes during the load", flushes)
			}
		})
	}
}

// flushUnderLoad runs checks of every kind through s while flusher flushes the scripts and
// functions of s's server, checks that all were answered and charged exactly once, and returns
// the number of flushes.
func flushUnderLoad(t *testing.T, flusher *redis.Client, s *Store) int64 {
	t.Cleanup(func() { flusher.Close() })
	const workers, each = 16, 60
	limits := []Limit{
		lim(key(t, "fw"), algorithm.FixedWindow, 100000, long, 0),
		lim(key(t, "tb"), algorithm.TokenBucket, 100000, long, 0),
		lim(key(t, "gcra"), algorithm.GCRA, 100000, long, 0),
		lim(key(t, "swl"), algorithm.SlidingWindowLog, 100000, long, 0),
	}
	// Half the checks carry all limits of one subject (one script call), half are pipelined
	// Checks of one request per limit, so both kinds meet the flushes.
	var charged atomic.Int64
	stop := make(chan struct{})
	var flushes atomic.Int64
	var fwg sync.WaitGroup
	fwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := flusher.ScriptFlush(context.Background()).Err(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
				return
			}
			if err := flusher.FunctionFlush(context.Background()).Err(); err != nil {
				t.Errorf("FUNCTION FLUSH: %v", err)
				return
			}
			flushes.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				var reqs []Request
				if (w+i)%2 == 0 {
					reqs = []Request{{Limits: limits, Cost: 1}}
				} else {
					for _, l := range limits {
						reqs = append(reqs, one(l, 1))
					}
				}
				res, err := s.Check(ctxT(t), reqs)
				if err != nil {
					t.Errorf("Check during the flushes: %v", err)
					continue
				}
				for _, r := range res {
					if !r.Allowed {
						t.Errorf("denied: %+v", r)
					}
				}
				charged.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	fwg.Wait()
	for _, l := range limits {
		res := check(t, s, peekReq(l))
		if got := res.Limits[0].Used; got != charged.Load() {
			t.Errorf("%s: used %d after %d checks, want exactly %d", l.Algorithm, got, charged.Load(), charged.Load())
		}
	}
	return flushes.Load()
}

// TestStoreRestartUnderLoad kills and restarts its own Redis while checks run: callers get
// errors during the outage, nothing panics or hangs, and the Store works after the restart.
func TestStoreRestartUnderLoad(t *testing.T) {
	t.Parallel()
	own, _, s := ownStore(t, StoreConfig{BatchTimeout: 300 * time.Millisecond})
	req := one(lim("{restart}:b", algorithm.FixedWindow, 1<<40, long, 0), 1)

	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				_, err := s.Check(ctx, []Request{req})
				cancel()
				if err != nil {
					failed.Add(1)
					time.Sleep(time.Millisecond)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	poll.Until(t, 10*time.Second, "checks before the restart", poll.True(func() bool { return ok.Load() > 100 }))
	own.Stop()
	poll.Until(t, 10*time.Second, "errors during the outage", poll.True(func() bool { return failed.Load() > 10 }))
	if err := own.Start(); err != nil {
		t.Fatalf("restart redis: %v", err)
	}
	okAt := ok.Load()
	poll.Until(t, 10*time.Second, "checks after the restart", poll.True(func() bool { return ok.Load() > okAt+100 }))
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("callers still blocked 5s after the load stopped")
	}
	res, err := s.Check(ctxT(t), []Request{req})
	if err != nil || !res[0].Allowed {
		t.Fatalf("Check after the restart: %+v, %v", res, err)
	}
	t.Logf("%d checks succeeded, %d failed", ok.Load(), failed.Load())
}

// TestStoreDeadlineWhilePaused: with Redis stalled by CLIENT PAUSE, a caller returns at its
// own deadline, whether its call is in flight or still queued behind a stalled batch (then
// it is never sent); a caller with a longer deadline, batched apart, waits the pause out; and
// the Store is healthy after it.
func TestStoreDeadlineWhilePaused(t *testing.T) {
	t.Parallel()
	own, admin := ownServer(t)

	const pause = 500 * time.Millisecond
	const shortDL, longDL = 50 * time.Millisecond, 5 * time.Second
	tests := []struct {
		name  string
		loops int
		// the two callers, in order: the first is in flight when the second comes
		first, second time.Duration
		// whether the short caller's call is known not to have run
		neverSent bool
	}{
		{"short in flight", 4, shortDL, longDL, false},
		{"short queued", 1, longDL, shortDL, true},
	}
	for i, tt := range tests { // one after the other: a pause stalls the whole server
		t.Run(tt.name, func(t *testing.T) {
			c := own.Client(0)
			t.Cleanup(func() { c.Close() })
			s := NewStoreWithConfig(c, StoreConfig{Loops: tt.loops})
			t.Cleanup(func() { s.Close() })
			l := lim(fmt.Sprintf("{pause}:%d", i), algorithm.FixedWindow, 1000, long, 0)
			if _, err := s.Check(ctxT(t), []Request{one(l, 1)}); err != nil {
				t.Fatalf("Check before the pause: %v", err)
			}
			if err := admin.Do(ctxT(t), "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE: %v", err)
			}
			paused := time.Now()

			type outcome struct {
				err  error
				took time.Duration
			}
			run := func(timeout time.Duration) <-chan outcome {
				out := make(chan outcome, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					start := time.Now()
					_, err := s.Check(ctx, []Request{one(l, 1)})
					out <- outcome{err, time.Since(start)}
				}()
				return out
			}
			first := run(tt.first)
			time.Sleep(10 * time.Millisecond) // the first is in flight
			second := run(tt.second)
			results := map[time.Duration]outcome{tt.first: <-first, tt.second: <-second}

			got := results[shortDL]
			if !errors.Is(got.err, context.DeadlineExceeded) {
				t.Errorf("short deadline: got %v, want context.DeadlineExceeded", got.err)
			}
			if got.took > 250*time.Millisecond {
				t.Errorf("short deadline: returned after %v, want about %v", got.took, shortDL)
			}
			got = results[longDL]
			if got.err != nil {
				t.Errorf("long deadline: %v", got.err)
			} else if since := time.Since(paused); since < pause-50*time.Millisecond {
				t.Errorf("long deadline: answered %v after the pause began, before it ended", since)
			}
			if tt.neverSent {
				if used := check(t, s, peekReq(l)).Limits[0].Used; used != 2 {
					t.Errorf("used %d after the pause, want 2: the queued call of the short deadline was sent", used)
				}
			}

			// After the pause, everyone is served: no loop stuck, no connection left broken.
			allowed, failed := hammer(s, 200, one(l, 1))
			if allowed != 200 || failed != 0 {
				t.Errorf("after the pause: %d allowed, %d failed of 200", allowed, failed)
			}
		})
	}
}

// TestStoreContextEnded: a caller whose context has already ended is answered at once and its
// calls are never sent.
func TestStoreContextEnded(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	l := lim(key(t, "b"), algorithm.FixedWindow, 10, long, 0)
	for _, mk := range []func() (context.Context, context.CancelFunc){
		func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
		func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Nanosecond)
		},
	} {
		ctx, cancel := mk()
		cancel()
		if _, err := s.Check(ctx, []Request{one(l, 1)}); !errors.Is(err, ctx.Err()) {
			t.Errorf("ended context: got %v, want %v", err, ctx.Err())
		}
	}
	if n := c.Exists(ctxT(t), l.Key).Val(); n != 0 {
		t.Errorf("a call of an ended context was sent")
	}
}

// TestStoreUnreachable: with nothing listening, a Check fails within its deadline.
func TestStoreUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := NewStoreWithConfig(c, storeConfig(StoreConfig{}))
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s.Check(ctx, []Request{one(lim("{x}:b", algorithm.GCRA, 1, time.Second, 0), 1)}); err == nil {
		t.Fatal("Check with nothing listening: nil error")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Check with nothing listening took %v", d)
	}
}

// TestCallerDeadlineBoundsOnlyItsWait: checks whose callers give up within a round trip travel
// in the same batches as a patient caller's. Before, a batch ran under the earliest deadline
// of its callers, so theirs failed the patient caller's checks, and the failures looked like
// Redis timing out. Now the patient caller gets every answer, exactly, and OnRoundTrip, which
// the engine's circuit counts, reports no failure: Redis never failed.
func TestCallerDeadlineBoundsOnlyItsWait(t *testing.T) {
	t.Parallel()
	var failures atomic.Int64
	var firstFailure atomic.Value
	s := NewStoreWithConfig(client(t), StoreConfig{Loops: 1, OnRoundTrip: func(err error) {
		if err != nil && failures.Add(1) == 1 {
			firstFailure.Store(err)
		}
	}})
	defer s.Close()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 4 {
		k := key(t, fmt.Sprint("attacker", i))
		wg.Go(func() {
			for ctx.Err() == nil {
				// Deadlines from 20 µs to 140 µs: some end in the queue, some in flight.
				cctx, cancel := context.WithTimeout(ctx, time.Duration(20+i*40)*time.Microsecond)
				_, _ = s.Check(cctx, []Request{one(lim(k, algorithm.FixedWindow, 1e9, long, 0), 1)})
				cancel()
			}
		})
	}
	victim := lim(key(t, "victim"), algorithm.FixedWindow, 50, long, 0)
	allowed := 0
	for i := range 200 {
		res, err := s.Check(context.Background(), []Request{one(victim, 1)})
		if err != nil {
			t.Fatalf("victim's check %d: %v", i, err)
		}
		if res[0].Allowed {
			allowed++
		}
	}
	stop()
	wg.Wait()
	if allowed != 50 {
		t.Errorf("victim: %d of 200 allowed, want 50", allowed)
	}
	if n := failures.Load(); n != 0 {
		t.Errorf("OnRoundTrip reported %d failures (first: %v), want none", n, firstFailure.Load())
	}
}

// TestOnRoundTripReportsOutage: a Redis that refuses connections is reported to OnRoundTrip
// as the failure of each batch.
func TestOnRoundTripReportsOutage(t *testing.T) {
	t.Parallel()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	got := make(chan error, 10)
	s := NewStoreWithConfig(down, StoreConfig{Loops: 1, OnRoundTrip: func(err error) { got <- err }})
	defer s.Close()
	if _, err := s.Check(context.Background(), []Request{one(lim("rl:{down}:x", algorithm.FixedWindow, 5, long, 0), 1)}); err == nil {
		t.Fatal("Check against a Redis that refuses connections: no error")
	}
	if err := <-got; !Unavailable(err) {
		t.Errorf("OnRoundTrip got %v, want an error for which Unavailable is true", err)
	}
}

// TestLeftInFlightRefunded: a caller whose deadline passes while its calls are in flight gets
// its error at once; the calls run when Redis answers, within the batch's own deadline, and the
// charges they made are refunded: a Check that failed keeps no charge it knows of.
func TestLeftInFlightRefunded(t *testing.T) {
	t.Parallel()
	_, c, s := ownStore(t, StoreConfig{BatchTimeout: 5 * time.Second})
	ctx := context.Background()
	for _, a := range allAlgorithms {
		l := lim("{left}:"+a.Code(), a, 5, long, 0)
		if _, err := s.Check(ctx, []Request{one(l, 1)}); err != nil { // script loaded, pool warm
			t.Fatal(err)
		}
		before := readRedisStats(t, c).calls
		if err := c.Do(ctx, "CLIENT", "PAUSE", "300", "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := s.Check(cctx, []Request{one(l, 2)})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: check past its deadline: %v, want context.DeadlineExceeded", a, err)
		}
		// The charge and its refund, once the pause is over.
		for deadline := time.Now().Add(5 * time.Second); readRedisStats(t, c).calls < before+2; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d script calls 5s after a check that left in flight, want its charge and its refund", a, readRedisStats(t, c).calls-before)
			}
		}
		res, err := s.Check(ctx, []Request{peekReq(l)})
		if err != nil {
			t.Fatal(err)
		}
		if got := res[0].Limits[0].Used; got != 1 {
			t.Errorf("%s: %d used after a check that left in flight, want 1 (its charge of 2 refunded)", a, got)
		}
	}

	// With an idempotency key, the record the call wrote goes with its charge: a retry is
	// decided afresh, not replayed as allowed with nothing charged.
	l := lim("{left}:keyed", algorithm.FixedWindow, 5, long, 0)
	keyed := Request{Limits: []Limit{l}, Cost: 2, IdempotencyKey: "rl:{left}:i:k", Fingerprint: "fp"}
	before := readRedisStats(t, c).calls
	if err := c.Do(ctx, "CLIENT", "PAUSE", "300", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := s.Check(cctx, []Request{keyed})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("keyed check past its deadline: %v, want context.DeadlineExceeded", err)
	}
	for deadline := time.Now().Add(5 * time.Second); readRedisStats(t, c).calls < before+2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("keyed check: no charge and refund 5s after it left in flight")
		}
	}
	res, err := s.Check(ctx, []Request{keyed})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; !r.Allowed || r.Replayed || r.Limits[0].Used != 2 {
		t.Errorf("retry of a keyed check that left in flight: allowed %v replayed %v used %d, want allowed afresh, 2 used",
			r.Allowed, r.Replayed, r.Limits[0].Used)
	}
}

// TestSendThenWait: Checks sent before any is waited for are each decided on its own, exactly
// (3 charges of a limit of 2 allow 2), however they were batched; a Pending waited for twice
// gives an error the second time, and a malformed Check sent gives its error at Wait.
func TestSendThenWait(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	k := key(t, "k")
	var ps []Pending
	for range 3 {
		ps = append(ps, s.Send(ctx, []Request{one(lim(k, algorithm.FixedWindow, 2, long, 0), 1)}))
	}
	allowed := 0
	for i := range ps {
		res, err := ps[i].Wait()
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if res[0].Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("allowed %d of 3 charges of a limit of 2, want 2", allowed)
	}
	if _, err := ps[0].Wait(); !errors.Is(err, errWaitedTwice) {
		t.Errorf("second Wait: %v, want errWaitedTwice", err)
	}
	bad := s.Send(ctx, []Request{one(lim(k, algorithm.FixedWindow, 2, long, 0), 0)})
	if _, err := bad.Wait(); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Wait of a check of cost 0: %v, want ErrInvalidRequest", err)
	}
}
