package bucket

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// inShared reports whether LayoutShared keeps l's bucket in a field of a shared hash.
func inShared(l Limit) bool {
	return l.Algorithm == algorithm.GCRA || l.Algorithm == algorithm.TokenBucket || l.Algorithm == algorithm.FixedWindow && l.Window >= time.Millisecond
}

// inField reports whether the tests' layout keeps l's bucket in a field of a shared hash.
func inField(l Limit) bool { return testLayout == LayoutShared && inShared(l) }

// bucketTTL returns how long l's bucket lives on in Redis: its key's PTTL, or in the shared
// layout its field's expiry (lua/shared.lua) less Redis's time.
func bucketTTL(t *testing.T, c redis.UniversalClient, l Limit) time.Duration {
	t.Helper()
	ctx := ctxT(t)
	if !inField(l) {
		return c.PTTL(ctx, l.Key).Val()
	}
	e, _ := sharedField(t, c, l.Key)
	now, err := serverOf(t, c, l.Key).Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(e).Sub(now)
}

// sharedField returns the expiry (ms) and state of key's field in its shared hash; 0 and "" when
// there is none.
func sharedField(t *testing.T, c redis.UniversalClient, key string) (int64, string) {
	t.Helper()
	v, err := c.HGet(ctxT(t), sharedHash(key, 1), key).Result()
	if err == redis.Nil {
		return 0, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	exp, state, ok := strings.Cut(v, "|")
	e, err := strconv.ParseInt(exp, 10, 64)
	if !ok || err != nil {
		t.Fatalf("field %s of %s: %q, want <expiry ms>|<state>", key, sharedHash(key, 1), v)
	}
	return e, state
}

// sharedStore returns a Store of LayoutShared on c (whatever the tests' layout), with cfg.
func sharedStore(t *testing.T, c redis.UniversalClient, cfg StoreConfig) *Store {
	t.Helper()
	cfg.Layout = LayoutShared
	s := NewStoreWithConfig(c, cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSharedState: what the shared layout writes (lua/shared.lua): the bucket as field
// "<expiry ms>|<state>" of its hash, no key of its own, the hash's "~" at least the field's
// expiry and the hash's TTL that "~"; an algorithm it does not cover keeps its key.
func TestSharedState(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := sharedStore(t, c, StoreConfig{})
	now := c.Time(ctxT(t)).Val()
	hour := time.Hour.Microseconds()
	wid := now.UnixMicro() / hour
	tests := []struct {
		l     Limit
		state string // the field's state; a prefix for a token bucket (its ts follows)
		exp   int64  // the field's expiry (ms), when known
	}{
		{lim("fw", algorithm.FixedWindow, 10, time.Hour, 0), "7", (wid + 1) * hour / 1000},
		{lim("tb", algorithm.TokenBucket, 10, long, 0), "3:", 0},
		{lim("gcra", algorithm.GCRA, 10, 10*time.Second, 0), "", 0},
		{lim("swl", algorithm.SlidingWindowLog, 10, time.Hour, 0), "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.l.Algorithm.String(), func(t *testing.T) {
			t.Parallel()
			tt.l.Key = key(t, tt.l.Key)
			if res := check(t, s, one(tt.l, 7)); !res.Allowed {
				t.Fatalf("charge of 7 denied")
			}
			ctx, srv, h := ctxT(t), serverOf(t, c, tt.l.Key), sharedHash(tt.l.Key, 1)
			keys := srv.Exists(ctx, tt.l.Key).Val()
			e, state := sharedField(t, c, tt.l.Key)
			if !inShared(tt.l) {
				if keys != 1 || state != "" {
					t.Errorf("key %d, field %q; want the key alone", keys, state)
				}
				return
			}
			if keys != 0 {
				t.Errorf("the bucket's key exists; want its field alone")
			}
			if !strings.HasPrefix(state, tt.state) || state == "" {
				t.Errorf("field state %q, want %q...", state, tt.state)
			}
			if tt.exp != 0 && e != tt.exp {
				t.Errorf("field expiry %d, want the end of the window, %d", e, tt.exp)
			}
			if e <= now.UnixMilli() {
				t.Errorf("field expiry %d, want after now (%d)", e, now.UnixMilli())
			}
			hx, err := srv.HGet(ctx, h, "~").Int64()
			if err != nil || hx < e {
				t.Errorf("the hash's ~: %d, %v; want at least the field's expiry %d", hx, err, e)
			}
			// Set as a TTL from the script's instant: its ~, or a ms later when the call came so.
			if got, want := srv.PExpireTime(ctx, h).Val(), time.Duration(hx)*time.Millisecond; got < want || got > want+time.Second {
				t.Errorf("the hash's PEXPIRETIME %v, want its ~, %v", got, want)
			}
			if enc := srv.ObjectEncoding(ctx, h).Val(); enc != "listpack" {
				t.Errorf("the hash's encoding %s, want listpack", enc)
			}
		})
	}
}

// TestSharedSweep: a field that has expired is deleted when a write moves its hash's "~", or
// by one in 16 writes that create a field (lua/shared.lua); one that has not expired stays,
// and an empty bucket reads as empty either way.
func TestSharedSweep(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := sharedStore(t, c, StoreConfig{})
	later := sharedStore(t, c, StoreConfig{ClockOffset: 5 * time.Minute})
	short := lim(key(t, "short"), algorithm.GCRA, 10, time.Second, 0) // empty again within 1 s
	hour := lim(key(t, "hour"), algorithm.GCRA, 10, time.Hour, 0)     // 6 minutes per unit
	check(t, s, one(short, 5))
	check(t, s, one(hour, 1))
	// Five minutes on, the short bucket's field has expired, the hour's not; a write past "~"
	// (now + 6 min + SLACK) sweeps.
	fresh := lim(key(t, "fresh"), algorithm.GCRA, 10, time.Hour, 0)
	if sharedHash(fresh.Key, 1) != sharedHash(short.Key, 1) {
		t.Fatalf("keys of one hash tag in two hashes")
	}
	check(t, later, one(fresh, 1))
	if e, state := sharedField(t, c, short.Key); state != "" {
		// The whole hash and both clocks: what the sweep saw (its "~" and every field).
		t.Errorf("the expired field stayed: %d|%s; hash %v, Redis's time %v",
			e, state, c.HGetAll(ctxT(t), sharedHash(short.Key, 1)).Val(), c.Time(ctxT(t)).Val())
	}
	for _, l := range []Limit{hour, fresh} {
		if _, state := sharedField(t, c, l.Key); state == "" {
			t.Errorf("field %s swept before its expiry", l.Key)
		}
	}
	if got := check(t, later, peekReq(short)).Limits[0].Remaining; got != 10 {
		t.Errorf("the swept bucket: remaining %d, want 10 (empty)", got)
	}

	// A day's window keeps "~" ahead of every write: the fields it creates sweep instead.
	day := lim(key(t, "day"), algorithm.FixedWindow, 10, 24*time.Hour, 0)
	check(t, later, one(day, 1))
	check(t, s, one(short, 5)) // expired for later
	// One in 16 creations sweeps (by the clock's µs): 200 leave it once in 400,000 runs.
	for i := range 200 {
		check(t, later, one(lim(key(t, fmt.Sprint("new", i)), algorithm.GCRA, 10, time.Minute, 0), 1))
		if _, state := sharedField(t, c, short.Key); state == "" {
			return
		}
	}
	t.Errorf("the expired field stayed after 200 new fields")
}

// TestSharedSweepMany: a sweep deletes any number of expired fields (HDELs of 1,000 at most:
// lua/shared.lua), here those of a hash far past the size --shared-hashes is meant to keep.
func TestSharedSweepMany(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := sharedStore(t, c, StoreConfig{})
	l := lim(key(t, "b"), algorithm.GCRA, 10, time.Hour, 0)
	h := sharedHash(l.Key, 1)
	args := []any{"~", "1"} // an old "~": the next write moves it and sweeps
	for i := range 9000 {
		args = append(args, key(t, fmt.Sprint("old", i)), "1|0") // expired in 1970
	}
	srv := serverOf(t, c, l.Key)
	if err := srv.HSet(ctxT(t), h, args...).Err(); err != nil {
		t.Fatal(err)
	}
	check(t, s, one(l, 1))
	if n := srv.HLen(ctxT(t), h).Val(); n != 2 {
		t.Errorf("the hash holds %d fields after the sweep, want 2 (~ and the new bucket)", n)
	}
}

// TestSharedMoves: a bucket of another layout's key is moved into its field by the shared
// layout's next write (the key deleted), its count kept, and a refund of that write gives
// back exactly what it charged; a lease of such a bucket moves it too.
func TestSharedMoves(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := sharedStore(t, c, StoreConfig{})
	for _, from := range []Layout{LayoutPrevious, LayoutCompact} {
		old := NewStoreWithConfig(c, StoreConfig{Layout: from})
		t.Cleanup(func() { old.Close() })
		for _, a := range []algorithm.ID{algorithm.FixedWindow, algorithm.GCRA, algorithm.TokenBucket} {
			t.Run(from.String()+"/"+a.String(), func(t *testing.T) {
				t.Parallel()
				l := lim(key(t, "b"), a, 10, long, 0)
				check(t, old, one(l, 3))
				res := check(t, s, one(l, 4))
				if !res.Allowed || res.Limits[0].Remaining != 3 {
					t.Fatalf("charge of 4 after 3: allowed %v remaining %d, want true 3", res.Allowed, res.Limits[0].Remaining)
				}
				if n := serverOf(t, c, l.Key).Exists(ctxT(t), l.Key).Val(); n != 0 {
					t.Errorf("the key stayed after the move")
				}
				refundNow(t, s, one(l, 4), res)
				if got := check(t, s, peekReq(l)).Limits[0].Remaining; got != 7 {
					t.Errorf("after the refund of 4: remaining %d, want 7", got)
				}
			})
		}
		t.Run(from.String()+"/lease", func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), algorithm.FixedWindow, 10, long, 0)
			check(t, old, one(l, 3))
			g, err := s.Allot(ctxT(t), l, 5)
			if err != nil || g.Units != 5 || g.Remaining != 2 {
				t.Fatalf("lease of 5 after 3: %+v, %v; want 5 granted, 2 remaining", g, err)
			}
			if n := serverOf(t, c, l.Key).Exists(ctxT(t), l.Key).Val(); n != 0 {
				t.Errorf("the key stayed after the lease")
			}
			if _, state := sharedField(t, c, l.Key); state != "8" {
				t.Errorf("field state %q after the lease, want 8", state)
			}
			if given, err := s.GiveBack(ctxT(t), l, g.Window, 4); err != nil || given != 4 {
				t.Errorf("give back 4: %d, %v", given, err)
			}
			if got := check(t, s, peekReq(l)).Limits[0].Remaining; got != 6 {
				t.Errorf("after giving back 4: remaining %d, want 6", got)
			}
		})
	}
}

// TestSharedHashes: with several hashes per slot the buckets of one subject stay in one hash,
// the subjects spread over them, and checks stay exact.
func TestSharedHashes(t *testing.T) {
	t.Parallel()
	const per = 4
	seen := map[string]bool{}
	for i := range 64 {
		h := sharedHash(fmt.Sprintf("rl:{user:%d}:fw:1d:/a", i), per)
		if h != sharedHash(fmt.Sprintf("rl:{user:%d}:gcra:1h:/b", i), per) {
			t.Fatalf("user %d: two hashes for one subject", i)
		}
		seen[h] = true
	}
	if len(seen) < 16 {
		t.Errorf("64 subjects in %d hashes, want them spread over slots and %d hashes each", len(seen), per)
	}
	c := client(t)
	s := sharedStore(t, c, StoreConfig{SharedHashes: per})
	l := lim(key(t, "b"), algorithm.FixedWindow, 5, time.Hour, 0)
	allowed := 0
	for range 8 {
		if check(t, s, one(l, 1)).Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("allowed %d of 8 against 5", allowed)
	}
	if v, err := serverOf(t, c, l.Key).HGet(ctxT(t), sharedHash(l.Key, per), l.Key).Result(); err != nil || !strings.HasSuffix(v, "|5") {
		t.Errorf("field in hash %s: %q, %v; want a count of 5", sharedHash(l.Key, per), v, err)
	}
}

// TestKeySlot: keySlot is Redis Cluster's slot (the cluster specification's examples); on a
// cluster, every shared hash is in its bucket key's slot.
func TestKeySlot(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		key  string
		slot int
	}{
		{"123456789", 12739}, {"somekey", 11058}, {"foo{hash_tag}", 2515}, {"{user1000}.following", 3443},
	} {
		if got := keySlot(hashTag(tt.key)); got != tt.slot {
			t.Errorf("keySlot(hashTag(%q)) = %d, want %d", tt.key, got, tt.slot)
		}
	}
	for _, k := range []string{"{}x", "x{", "x}{"} {
		if got := hashTag(k); got != k {
			t.Errorf("hashTag(%q) = %q, want the whole key (no tag)", k, got)
		}
	}
	for s, tag := range slotTags() {
		if keySlot(tag) != s {
			t.Fatalf("slot tag %q of slot %d is in slot %d", tag, s, keySlot(tag))
		}
	}
	cc, ok := client(t).(*redis.ClusterClient)
	if !ok {
		return
	}
	for i := range 200 {
		k := fmt.Sprintf("rl:{user:%d}:fw:1d:/a", i)
		want, err := cc.ClusterKeySlot(ctxT(t), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := cc.ClusterKeySlot(ctxT(t), sharedHash(k, 3)).Result(); got != want || int64(keySlot(hashTag(k))) != want {
			t.Errorf("%s in slot %d, its hash %s in %d, keySlot %d", k, want, sharedHash(k, 3), got, keySlot(hashTag(k)))
		}
	}
}

// TestSharedRollingSwitch: during a rolling switch between the mixed and shared layouts,
// checkers of both race on one bucket, which moves into its field under them: exactly the
// limit is admitted (shared.lua: a bucket lives in its field or its key, never both).
func TestSharedRollingSwitch(t *testing.T) {
	t.Parallel()
	const L, calls = 50, 200
	var stores []*Store
	for i := range 4 {
		c := client(t)
		cfg := StoreConfig{Layout: LayoutMixed, BatchTimeout: time.Minute}
		if i%2 == 1 {
			cfg.Layout = LayoutShared
		}
		s := NewStoreWithConfig(c, cfg)
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	for _, a := range []algorithm.ID{algorithm.FixedWindow, algorithm.GCRA, algorithm.TokenBucket} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), a, L, long, 0)
			check(t, stores[0], one(l, 1)) // a mixed checker's key first
			if got := raceCharges(t, stores, l, calls); got != L-1 {
				t.Errorf("allowed %d of %d after 1, want %d", got, calls, L-1)
			}
			for _, s := range stores {
				if got := check(t, s, peekReq(l)).Limits[0].Remaining; got != 0 {
					t.Errorf("a checker reads remaining %d, want 0", got)
				}
			}
		})
	}
}

// TestSharedExpiredField: a bucket whose field has expired is written there again, by a shared
// writer without a look at its key and by a mixed one too, so that the two never split it into
// a field and a key (lua/shared.lua); a sweep then finds the field live.
func TestSharedExpiredField(t *testing.T) {
	t.Parallel()
	c := client(t)
	now := sharedStore(t, c, StoreConfig{})
	later := map[Layout]*Store{}
	for _, l := range []Layout{LayoutShared, LayoutMixed} {
		s := NewStoreWithConfig(c, StoreConfig{Layout: l, ClockOffset: 5 * time.Minute})
		t.Cleanup(func() { s.Close() })
		later[l] = s
	}
	for _, a := range []algorithm.ID{algorithm.FixedWindow, algorithm.GCRA, algorithm.TokenBucket} {
		for _, writer := range []Layout{LayoutMixed, LayoutShared} {
			t.Run(a.String()+"/"+writer.String(), func(t *testing.T) {
				t.Parallel()
				// Expired five minutes on; a unit refills in 6 s, longer than the test.
				l := lim(key(t, "b"), a, 10, time.Minute, 0)
				check(t, now, one(l, 5))
				if res := check(t, later[writer], one(l, 3)); !res.Allowed || res.Limits[0].Remaining != 7 {
					t.Fatalf("%s over the expired field: allowed %v remaining %d, want true 7", writer, res.Allowed, res.Limits[0].Remaining)
				}
				if n := serverOf(t, c, l.Key).Exists(ctxT(t), l.Key).Val(); n != 0 {
					t.Errorf("%s wrote a key over an expired field", writer)
				}
				for _, r := range later {
					if got := check(t, r, peekReq(l)).Limits[0].Remaining; got != 7 {
						t.Errorf("%s after %s: remaining %d, want 7", r.b.cfg.Layout, writer, got)
					}
				}
			})
		}
	}
}

// raceCharges sends n charges of 1 to l at once, spread over stores, and returns how many were
// allowed; an error fails t.
func raceCharges(t *testing.T, stores []*Store, l Limit, n int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := stores[i%len(stores)].Check(context.Background(), []Request{one(l, 1)})
			if err != nil {
				t.Error(err)
				return
			}
			if res[0].Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	return allowed.Load()
}

// BenchmarkSharedHash: naming a bucket's shared hash, which a check of the mixed or shared
// layout does per limit.
func BenchmarkSharedHash(b *testing.B) {
	b.ReportAllocs()
	slotTags()
	for i := 0; b.Loop(); i++ {
		sharedHash("rl:{user:123456}:fw:1d:/api/*", 1+i%2)
	}
}
