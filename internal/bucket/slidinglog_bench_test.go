package bucket

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// BenchmarkSlidingLogCost measures what one sliding window log check costs Redis, by the
// check's cost: the script's time in Redis (INFO commandstats, µs per call) and the memory its
// window grows by (INFO memory). Each check charges a fresh key with a limit of 1e6 per hour,
// so that every check is allowed and its entries stay; the "one key" case makes every check on
// one key instead, whose window grows by one check each time.
//
//	go test -run='^$' -bench=SlidingLogCost -benchtime=20x ./internal/bucket/
func BenchmarkSlidingLogCost(b *testing.B) {
	for _, c := range []struct {
		cost   int64
		oneKey bool
	}{{1, false}, {1000, false}, {1_000_000, false}, {1, true}} {
		cost, name := c.cost, "cost="+strconv.FormatInt(c.cost, 10)
		if c.oneKey {
			name += "/one_key"
		}
		b.Run(name, func(b *testing.B) {
			// Today's script needs seconds for a cost of 1e6: no deadline may cut it short.
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 62, ReadTimeout: time.Minute})
			defer rdb.Close()
			ctx := context.Background()
			if err := rdb.FlushDB(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			defer rdb.FlushDB(ctx)
			s := NewStoreWithConfig(rdb, StoreConfig{BatchTimeout: time.Minute})
			defer s.Close()
			if err := s.LoadScript(ctx); err != nil {
				b.Fatal(err)
			}
			// The first use of a Lua table size grows the interpreter's memory for good: one
			// check outside the measure keeps that out of the window's bytes.
			warm := one(lim("{bench}:warm", algorithm.SlidingWindowLog, 1_000_000, time.Hour, 0), cost)
			if _, err := s.Check(ctx, []Request{warm}); err != nil {
				b.Fatal(err)
			}
			before, mem := readRedisStats(b, rdb), usedMemory(b, rdb)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := "{bench}:" + strconv.Itoa(i)
				if c.oneKey {
					k = "{bench}:one"
				}
				req := one(lim(k, algorithm.SlidingWindowLog, 1_000_000, time.Hour, 0), cost)
				res, err := s.Check(ctx, []Request{req})
				if err != nil || !res[0].Allowed {
					b.Fatalf("check %d: %+v, %v", i, res, err)
				}
			}
			b.StopTimer()
			after := readRedisStats(b, rdb)
			b.ReportMetric(float64(after.usec-before.usec)/float64(after.calls-before.calls), "redis-µs/check")
			b.ReportMetric(float64(usedMemory(b, rdb)-mem)/float64(b.N), "redis-bytes/check")
		})
	}
}
