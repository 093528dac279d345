package bucket

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// TestStoreNoScript: after SCRIPT FLUSH and FUNCTION FLUSH, pipelined and single Checks still
// work, exactly, and the batch function library is loaded again where they ran.
func TestStoreNoScript(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	limits := make([]Limit, 3)
	remaining := make([]int64, len(limits))
	for i := range limits {
		limits[i] = lim(key(t, fmt.Sprint(i)), algorithm.GCRA, 10, long, 0)
		remaining[i] = 10
	}
	for round, idx := range [][]int{{0, 1, 2}, {0}, {1, 2}} {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		flushFunctions(t, c)
		reqs := make([]Request, len(idx))
		for j, i := range idx {
			reqs[j] = one(limits[i], 1)
		}
		res, err := s.Check(ctx, reqs)
		if err != nil {
			t.Fatalf("round %d after SCRIPT FLUSH and FUNCTION FLUSH: %v", round, err)
		}
		for j, i := range idx {
			remaining[i]--
			if r := res[j]; !r.Allowed || r.Limits[0].Remaining != remaining[i] {
				t.Errorf("round %d limit %d: got allowed %v remaining %d, want true %d", round, i, r.Allowed, r.Limits[0].Remaining, remaining[i])
			}
		}
		// On a cluster the library is loaded on the master that ran it.
		for _, i := range idx {
			if !libraryLoaded(t, serverOf(t, c, limits[i].Key), s.b.lib.name) {
				t.Errorf("round %d limit %d: the batch function library is not loaded after the check", round, i)
			}
		}
	}
}

// flushFunctions deletes every function library of c's server, or of each master of a cluster.
func flushFunctions(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	flush := func(ctx context.Context, c *redis.Client) error { return c.FunctionFlush(ctx).Err() }
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctxT(t), flush)
	} else {
		err = c.FunctionFlush(ctxT(t)).Err()
	}
	if err != nil {
		t.Fatalf("FUNCTION FLUSH: %v", err)
	}
}

// libraryLoaded reports whether c's server has the function library name.
func libraryLoaded(t testing.TB, c redis.Cmdable, name string) bool {
	t.Helper()
	libs, err := c.FunctionList(ctxT(t), redis.FunctionListQuery{LibraryNamePattern: name}).Result()
	if err != nil {
		t.Fatalf("FUNCTION LIST: %v", err)
	}
	return len(libs) == 1
}

// TestStoreRedisDown runs on its own server, since it kills it.
func TestStoreRedisDown(t *testing.T) {
	t.Parallel()
	// The batches' own deadline is the callers' (as the engine sets it): a batch outliving its
	// callers would still be sending when Redis comes back, and cache the script.
	own, c, s := ownStore(t, StoreConfig{BatchTimeout: 300 * time.Millisecond})
	l := lim("{down}:b", algorithm.TokenBucket, 10, long, 0)
	reqs := []Request{one(l, 1), one(lim("{down}:c", algorithm.FixedWindow, 10, long, 0), 1)}
	if _, err := s.Check(ctxT(t), reqs); err != nil {
		t.Fatalf("Check with Redis up: %v", err)
	}

	own.Stop()
	for _, in := range [][]Request{reqs[:1], reqs} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		res, err := s.Check(ctx, in)
		cancel()
		if err == nil || res != nil {
			t.Errorf("%d requests with Redis down: got %v, %v, want an error", len(in), res, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%d requests with Redis down: took %v, want about the 300ms deadline", len(in), d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if err := s.Ping(ctx); err == nil {
		t.Errorf("Ping with Redis down: nil error")
	}
	cancel()

	// A restarted server has lost the script and the buckets; Check must work at once.
	if err := own.Start(); err != nil {
		t.Fatalf("restart redis: %v", err)
	}
	if err := s.Ping(ctxT(t)); err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
	if cached, _ := c.ScriptExists(ctxT(t), checkScripts[testLayout].Hash()).Result(); len(cached) != 1 || cached[0] {
		t.Fatalf("script cached right after the restart: %v, want not cached", cached)
	}
	if err := s.LoadScript(ctxT(t)); err != nil {
		t.Fatalf("LoadScript after restart: %v", err)
	}
	if cached, _ := c.ScriptExists(ctxT(t), checkScripts[testLayout].Hash()).Result(); len(cached) != 1 || !cached[0] {
		t.Errorf("script cached after LoadScript: %v, want cached", cached)
	}
	if !libraryLoaded(t, c, s.b.lib.name) {
		t.Errorf("batch function library not loaded after LoadScript")
	}
	if err := s.LoadScript(ctxT(t)); err != nil {
		t.Errorf("LoadScript again (the library is loaded): %v", err)
	}
	if err := c.ScriptFlush(ctxT(t)).Err(); err != nil { // Check must still cope with NOSCRIPT
		t.Fatal(err)
	}
	flushFunctions(t, c)
	res, err := s.Check(ctxT(t), reqs)
	if err != nil {
		t.Fatalf("Check after restart: %v", err)
	}
	if got := res[0].Limits[0].Remaining; got != 9 {
		t.Errorf("after restart: remaining %d, want 9 (a fresh bucket)", got)
	}
	if got := check(t, s, one(l, 1)).Limits[0].Remaining; got != 8 {
		t.Errorf("single check after restart: remaining %d, want 8", got)
	}
}

// TestStoreTTL: every bucket key expires once it is equivalent to a missing one.
func TestStoreTTL(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	const W = 10 * time.Second
	tests := []struct {
		alg      algorithm.ID
		min, max time.Duration
	}{
		{algorithm.TokenBucket, W/5 - time.Second, W / 5}, // one token to refill
		{algorithm.LeakyBucket, W/5 - time.Second, W / 5}, // one unit to leak
		{algorithm.GCRA, W/5 - time.Second, W / 5},        // one period
		{algorithm.FixedWindow, time.Millisecond, W},      // the end of the window
		{algorithm.SlidingWindowLog, W - time.Second, W},  // the window after the newest entry
		{algorithm.SlidingWindowCounter, W - time.Second, 2 * W},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), tt.alg, 5, W, 0)
			check(t, s, one(l, 1))
			ttl := bucketTTL(t, c, l)
			if inField(l) && tt.alg != algorithm.FixedWindow {
				tt.max += time.Second // a field's expiry is rounded up to a second (lua/shared.lua)
			}
			if ttl < tt.min || ttl > tt.max {
				t.Errorf("PTTL %v, want in [%v, %v]", ttl, tt.min, tt.max)
			}
		})
	}
}

// TestStoreExactUnderConcurrency: many checks from several clients (as from several checker
// processes) race on one key with limit 100; exactly 100 get through. The stores get a long
// BatchTimeout: 400 of them start at once, and on a loaded CI run a pipeline queued behind the
// others outlived the default second (this test is about exactness, not speed).
func TestStoreExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	const L, clients, calls = 100, 4, 400
	rdbs := make([]redis.UniversalClient, clients)
	for i := range rdbs {
		rdbs[i] = srv.UniversalClient()
		t.Cleanup(func() { rdbs[i].Close() })
	}
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			l := lim(key(t, "b"), a, L, long, 0)
			var allowed, failed atomic.Int64
			var firstErr atomic.Value
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range calls {
				s := NewStoreWithConfig(rdbs[i%clients], storeConfig(StoreConfig{BatchTimeout: 30 * time.Second}))
				wg.Go(func() {
					defer s.Close()
					<-start
					res, err := s.Check(context.Background(), []Request{one(l, 1)})
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						return
					}
					if res[0].Allowed {
						allowed.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if allowed.Load() != L || failed.Load() != 0 {
				t.Errorf("got %d allowed and %d errors (first: %v) of %d checks, want exactly %d allowed", allowed.Load(), failed.Load(), firstErr.Load(), calls, L)
			}
		})
	}
}

func TestStoreDelete(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	// Different hash tags: the keys would be in different cluster slots.
	a := lim("{a-"+key(t, "b")[1:], algorithm.TokenBucket, 5, long, 0)
	b := lim("{b-"+key(t, "b")[1:], algorithm.SlidingWindowLog, 5, long, 0)
	check(t, s, one(a, 5))
	check(t, s, one(b, 5))
	n, err := s.Delete(ctx, a.Key, b.Key, key(t, "never-written"))
	if err != nil || n != 2 {
		t.Fatalf("Delete: got %d, %v, want 2, nil", n, err)
	}
	for _, l := range []Limit{a, b} {
		if res := check(t, s, peekReq(l)); res.Limits[0].Remaining != 5 {
			t.Errorf("%s after Delete: remaining %d, want 5", l.Algorithm, res.Limits[0].Remaining)
		}
	}
	if n, err := s.Delete(ctx); n != 0 || err != nil {
		t.Errorf("Delete of nothing: got %d, %v, want 0, nil", n, err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestLocalExactUnderConcurrency is the same for Local, which must also be race-free.
func TestLocalExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	const L, goroutines, each = 100, 8, 50
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			loc := NewLocal(0)
			limits := []Limit{lim("x", a, L, long, 0), lim("y", algorithm.FixedWindow, 10*L, long, 0)}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			now := time.Now()
			for range goroutines {
				wg.Go(func() {
					for range each {
						if loc.Check(now, Request{Limits: limits, Cost: 1}).Allowed {
							allowed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if allowed.Load() != L {
				t.Errorf("got %d allowed of %d checks, want exactly %d", allowed.Load(), goroutines*each, L)
			}
		})
	}
}

func (l *Local) len() int {
	n := 0
	for i := range l.shards {
		l.shards[i].mu.Lock()
		n += len(l.shards[i].m)
		l.shards[i].mu.Unlock()
	}
	return n
}

// TestLocalEviction: the key count stays bounded, and expired entries go before live ones.
func TestLocalEviction(t *testing.T) {
	t.Parallel()
	const max = 256
	loc := NewLocal(max)
	now := time.Now()
	for i := range 20 * max {
		loc.Check(now, one(lim(fmt.Sprint("k", i), algorithm.TokenBucket, 5, time.Hour, 0), 1))
	}
	if n := loc.len(); n > max {
		t.Errorf("%d keys held, want at most %d", n, max)
	}

	// A full Local of expired short-window entries makes room from them: the long-window
	// entries written afterwards are all kept. Eviction samples 8 entries of a shard, so the
	// long keys are few (about one per shard): a shard whose sample holds only live keys
	// would rightly evict one of them (CI once drew 8 of 64 long keys into one shard).
	const long = max / 16
	loc = NewLocal(max)
	for i := range max {
		loc.Check(now, one(lim(fmt.Sprint("short", i), algorithm.FixedWindow, 5, time.Millisecond, 0), 1))
	}
	later := now.Add(time.Second)
	for i := range long {
		loc.Check(later, one(lim(fmt.Sprint("long", i), algorithm.GCRA, 5, time.Hour, 0), 1))
	}
	for i := range long {
		if res := loc.Check(later, peekReq(lim(fmt.Sprint("long", i), algorithm.GCRA, 5, time.Hour, 0))); res.Limits[0].Remaining != 4 {
			t.Fatalf("long-window key %d was evicted while expired keys were present", i)
		}
	}
	if n := loc.len(); n > max {
		t.Errorf("%d keys held, want at most %d", n, max)
	}
}
