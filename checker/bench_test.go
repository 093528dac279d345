package checker

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/checkertest"
	"github.com/quotaflow/quotaflow/internal/rules"
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
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, kv := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}
