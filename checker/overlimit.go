package checker

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/internal/bucket"
)

// overLimitCache remembers buckets known to deny until a known instant (envoy's over-limit
// cache), so that a caller hammering a spent limit is answered without a Redis round trip.
//
// It is exact: Redis denied cost c at time t with wait r, so no check of that bucket costing c
// or more can be allowed before t + r unless capacity is given back. The instant is taken from
// this process's monotonic clock at the moment the Redis call was sent, which is no later than
// Redis's t, so latency can only shorten a cached denial, never stretch it. Capacity comes back
// early only through ResetLimit (cleared here at once; through another checker process, seen
// when the entry expires), a settle or cancel that refunds part of a reservation (likewise), a
// rule change (SetRules clears the cache), or a refund racing the denial (a multi-subject check
// denied in the same instant). Each of those only makes a cached denial stale: it under-admits
// until it expires, never over-admits. A concurrency rule's capacity comes
// back whenever a holder releases its place, so its denials are never cached (cacheDenials).
type overLimitCache struct {
	seed   maphash.Seed
	epoch  time.Time
	max    int // entries per shard
	shards [64]overLimitShard
}

type overLimitShard struct {
	mu sync.Mutex
	m  map[string]overLimitEntry
}

// overLimitEntry: every check costing at least cost is denied until (nanoseconds since epoch).
type overLimitEntry struct {
	until int64
	cost  int64
	res   bucket.LimitResult // the denial, for the numbers of a cached answer
}

func newOverLimitCache(maxEntries int) *overLimitCache {
	if maxEntries <= 0 {
		maxEntries = 1 << 18
	}
	c := &overLimitCache{seed: maphash.MakeSeed(), epoch: time.Now(), max: max(1, maxEntries/64)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]overLimitEntry)
	}
	return c
}

// now is the monotonic clock the entries are kept on.
func (c *overLimitCache) now() int64 { return int64(time.Since(c.epoch)) }

func (c *overLimitCache) shard(key string) *overLimitShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// lookup reports whether key denies a check of cost at now, with the cached denial adjusted to
// the time left.
func (c *overLimitCache) lookup(key string, cost, now int64) (bucket.LimitResult, bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if ok && now >= e.until {
		delete(sh.m, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || cost < e.cost {
		return bucket.LimitResult{}, false
	}
	res := e.res
	res.RetryAfter = time.Duration(e.until - now)
	return res, true
}

// deny records that key denied cost, sent at sentAt, with res.
func (c *overLimitCache) deny(key string, cost, sentAt int64, res bucket.LimitResult) {
	until := sentAt + int64(res.RetryAfter)
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[key]; ok && e.until >= until && e.cost <= cost {
		return // the entry we have says more
	}
	if len(sh.m) >= c.max {
		for k, e := range sh.m { // make room from what has expired; else do without
			if e.until <= sentAt {
				delete(sh.m, k)
			}
		}
		if len(sh.m) >= c.max {
			return
		}
	}
	sh.m[key] = overLimitEntry{until: until, cost: cost, res: res}
}

// forget drops keys (after a reset, or a settle's refund).
func (c *overLimitCache) forget(keys []string) {
	for _, k := range keys {
		sh := c.shard(k)
		sh.mu.Lock()
		delete(sh.m, k)
		sh.mu.Unlock()
	}
}

// clear drops everything (after a rule change).
func (c *overLimitCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}
