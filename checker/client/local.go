package client

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxEntries bounds the deny cache and the local buckets: past it, expired entries are swept,
// and a cache still full stores nothing new (the checker decides those checks).
const maxEntries = 100_000

// subjectKey names what a check counts against: its subjects, endpoint, tier and entitlement.
func subjectKey(r Request) string {
	subs := make([]string, len(r.Subjects))
	for i, s := range r.Subjects {
		subs[i] = strconv.Itoa(int(s.Dimension)) + ":" + s.ID
	}
	slices.Sort(subs)
	return r.Tier + "\x00" + r.Entitlement + "\x00" + r.Endpoint + "\x00" + strings.Join(subs, "\x00")
}

func costOf(c int64) int64 { return max(c, 1) }

// denyCache remembers the checker's denials until their retry_after: a check of the same
// subjects, endpoint and tier costing at least as much would be denied again, so it is
// denied here without a call. It can only repeat a denial the checker made.
type denyCache struct {
	mu sync.Mutex
	m  map[string]denial
}

type denial struct {
	until time.Time
	cost  int64
	d     Decision
}

func newDenyCache() *denyCache { return &denyCache{m: make(map[string]denial)} }

func (c *denyCache) get(key string, cost int64, now time.Time) (Decision, bool) {
	c.mu.Lock()
	e, ok := c.m[key]
	c.mu.Unlock()
	if !ok || !now.Before(e.until) || costOf(cost) < e.cost {
		return Decision{}, false
	}
	d := e.d
	d.Source, d.Replayed, d.RetryAfter = SourceDenyCache, false, e.until.Sub(now)
	return d, true
}

func (c *denyCache) put(key string, cost int64, d Decision, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxEntries {
		now := time.Now()
		for k, e := range c.m {
			if !now.Before(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxEntries {
			return
		}
	}
	c.m[key] = denial{until: until, cost: costOf(cost), d: d}
}

// localBuckets are FailLocal's token buckets, one per subject key.
type localBuckets struct {
	rate  float64
	burst float64
	mu    sync.Mutex
	m     map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newLocalBuckets(rate float64, burst int) *localBuckets {
	return &localBuckets{rate: rate, burst: float64(burst), m: make(map[string]*bucket)}
}

// take takes one token of key's bucket: allowed, or denied with the wait for the next token.
func (l *localBuckets) take(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.m[key]
	if !ok {
		if len(l.m) >= maxEntries {
			// Forgetting every bucket only lets more through, which a fail mode may.
			clear(l.m)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.m[key] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}
