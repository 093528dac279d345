package checker

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

const benchRules = `rules:
- {id: one, dimension: user, endpoint: /one, algorithm: token_bucket, limit: 1000000000, window: 1s}
- {id: three-s, dimension: user, endpoint: /three, algorithm: gcra, limit: 1000000000, window: 1s}
- {id: three-m, dimension: user, endpoint: /three, algorithm: token_bucket, limit: 1000000000, window: 1m}
- {id: three-d, dimension: user, endpoint: /three, algorithm: fixed_window, limit: 1000000000, window: 24h}
`

// BenchmarkDecide measures Engine.Check inside the process (rule lookup, keys, one Redis round trip,
// the outcome), spread over 10k subjects.
// With overrides, 1000 subjects have their own limit and a multiplier scales the whole tier:
// the cost of the override lookups on every check.
func BenchmarkDecide(b *testing.B) {
	for _, c := range []struct {
		name, ep  string
		overrides bool
	}{
		{"one-limits", "/one", false}, {"three-limits", "/three", false}, {"three-limits-overrides", "/three", true},
	} {
		ep := c.ep
		b.Run(c.name, func(b *testing.B) {
			set := mustRules(b, benchRules)
			if c.overrides {
				set = set.WithOverrides(benchOverrides())
			}
			e := newEngine(b, Config{Rules: set})
			rdb := checkertest.Redis(redisSrv.Addr)
			defer rdb.Close()
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			before := scriptMicros(b, rdb)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := e.Check(context.Background(), userQuery("bench-"+strconv.Itoa(int(n.Add(1)%10000)), ep))
					if err != nil || !out.Allowed {
						b.Fatalf("check: %v allowed=%v", err, out != nil && out.Allowed)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric((scriptMicros(b, rdb)-before)/float64(b.N), "redis-µs/check")
		})
	}
}

func benchOverrides() []rules.Override {
	now := time.Now()
	ovs := []rules.Override{{ID: "tier", Tier: rules.ImplicitTier, Multiplier: 0.9, Reason: "bench", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}}
	for i := range 1000 {
		ovs = append(ovs, rules.Override{ID: "s" + strconv.Itoa(i), Dimension: "user", Identifier: "bench-" + strconv.Itoa(i*10), RuleID: "three-m",
			Limit: 1_000_000_000, Reason: "bench", CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	}
	return ovs
}

// scriptMicros is the Redis CPU time spent in scripts so far (INFO commandstats), in µs.
func scriptMicros(b *testing.B, rdb *redis.Client) float64 {
	return commandMicros(b, rdb, "evalsha", "eval", "fcall")
}

// scriptCallCount is how many script calls Redis has run so far: a batch of checks is one.
func scriptCallCount(b *testing.B, rdb *redis.Client) float64 {
	return commandStat(b, rdb, "calls=", "evalsha", "eval", "fcall")
}

// commandMicros is the Redis CPU time (µs) spent so far in the commands named.
func commandMicros(b *testing.B, rdb *redis.Client, names ...string) float64 {
	return commandStat(b, rdb, "usec=", names...)
}

// commandStat sums a figure of INFO commandstats (field: "usec=", "calls=") over the commands
// named.
func commandStat(b *testing.B, rdb *redis.Client, field string, names ...string) float64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		name, _, _ := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !strings.HasPrefix(line, "cmdstat_") || !slices.Contains(names, name) {
			continue
		}
		for _, kv := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
			if v, ok := strings.CutPrefix(kv, field); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

// keyedRules are the shape of the dev rules: a user, an IP and a global limit, and a shadow
// rule on the user; nobody reaches them, and (fixed windows: a token bucket far from full
// expires at once) no bucket expires while a benchmark runs.
const keyedRules = `rules:
- {id: user, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 1000000000, window: 24h}
- {id: user-shadow, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 1000000000, window: 1h, shadow: true}
- {id: ip, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 1000000000, window: 24h}
- {id: global, dimension: global, endpoint: /api/*, algorithm: fixed_window, limit: 1000000000, window: 24h}
`

// keyedQuery is check n of a user among 10k, from an IP among 2.5k, with idempotency key key.
func keyedQuery(n int, key string) *Query {
	return &Query{
		Subjects: []Subject{{Dimension: rules.DimensionUser, ID: "user-" + strconv.Itoa(n%10000)},
			{Dimension: rules.DimensionIP, ID: "10.0." + strconv.Itoa(n%2500/250) + "." + strconv.Itoa(n%250)}},
		Endpoint: "/api/v1/orders", Cost: 1, IdempotencyKey: key,
	}
}

// BenchmarkDecideKeyed measures Engine.Check of checks with a user, an IP and the global
// subject (three script calls, three slots on a cluster), without and with an idempotency key
// (a random 128-bit key, as checker/client makes): what a key costs in time and Redis CPU.
func BenchmarkDecideKeyed(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		b.Run(map[bool]string{false: "no-key", true: "key"}[keyed], func(b *testing.B) {
			e := newEngine(b, Config{Rules: mustRules(b, keyedRules)})
			rdb := checkertest.Redis(redisSrv.Addr)
			defer rdb.Close()
			var n atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			b.ReportAllocs()
			b.SetParallelism(8)
			before := scriptMicros(b, rdb)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(n.Add(1))
					var key string
					if keyed {
						key = run + "-" + strconv.Itoa(i)
					}
					out, err := e.Check(context.Background(), keyedQuery(i, key))
					if err != nil || !out.Allowed {
						b.Fatalf("check: %v allowed=%v", err, out != nil && out.Allowed)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric((scriptMicros(b, rdb)-before)/float64(b.N), "redis-µs/check")
		})
	}
}

// BenchmarkIdempotencyMemory measures what idempotency records cost Redis: on a Redis of its
// own it creates the buckets of 10k users, 2.5k IPs and the global subject with checks
// without a key, then runs QUOTAFLOW_MEMBENCH_KEYS (default 100,000) allowed checks with a
// new key each, and divides the growth of INFO memory's used_memory and of the key count by
// the number of checks; it also reports the MEMORY USAGE of one record (the key and its value,
// without the expiry entry and hash-table slots that used_memory includes). It ignores b.N:
// run it once, with -benchtime=1x.
//
//	go test -run='^$' -bench=IdempotencyMemory -benchtime=1x ./checker/
func BenchmarkIdempotencyMemory(b *testing.B) {
	checks := 100_000
	if v, err := strconv.Atoi(os.Getenv("QUOTAFLOW_MEMBENCH_KEYS")); err == nil && v > 0 {
		checks = v
	}
	rs, err := redistest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	rdb := checkertest.Redis(rs.Addr)
	defer rdb.Close()
	e := newEngine(b, Config{Redis: rdb, Rules: mustRules(b, keyedRules)})
	ctx := context.Background()
	do := func(from, to int, keyed bool) {
		var wg sync.WaitGroup
		next := atomic.Int64{}
		next.Store(int64(from))
		for range 32 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < to; i = int(next.Add(1)) - 1 {
					var key string
					if keyed {
						key = "key-" + strconv.Itoa(i)
					}
					if out, err := e.Check(ctx, keyedQuery(i, key)); err != nil || !out.Allowed {
						b.Errorf("check %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	do(0, 10000, false)
	keysBefore, memBefore := rdb.DBSize(ctx).Val(), usedMemory(b, rdb)
	do(0, checks, true)
	keys, mem := rdb.DBSize(ctx).Val()-keysBefore, usedMemory(b, rdb)-memBefore
	var one int64
	if ks, _, err := rdb.Scan(ctx, 0, "rl:*:i:*", 1000).Result(); err == nil && len(ks) > 0 {
		one = rdb.MemoryUsage(ctx, ks[0]).Val()
	} else if ks, _, err := rdb.Scan(ctx, 0, "rl:*:idem:*", 1000).Result(); err == nil && len(ks) > 0 {
		one = rdb.MemoryUsage(ctx, ks[0]).Val() // the previous version's records
	}
	b.ReportMetric(float64(mem)/float64(checks), "bytes/check")
	b.ReportMetric(float64(keys)/float64(checks), "records/check")
	b.ReportMetric(float64(one), "memory-usage-bytes/record")
}

// usedMemory is redistest.UsedMemory, failing b on an error.
func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	n, err := redistest.UsedMemory(context.Background(), rdb)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
