package bucket

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkConcurrency measures what a place in flight costs Redis: the script time of the
// check that takes it (one concurrency limit) and of its Release, per operation, from INFO
// commandstats; and, for memory, the growth of used_memory per place held (QUOTAFLOW_MEMBENCH_KEYS
// places, 100 per bucket, as a service's subjects hold them).
func BenchmarkConcurrency(b *testing.B) {
	b.Run("acquire+release", func(b *testing.B) {
		s, c := newStore(b)
		ctx := context.Background()
		const perCall = 32
		reqs := make([]Request, perCall)
		holders := make([]string, perCall)
		var acquire, release int64
		var n int
		for i := 0; i < b.N; i += perCall {
			for j := range reqs {
				holders[j] = fmt.Sprintf("h%d-%d", i, j)
				reqs[j] = one(ccLimit(fmt.Sprintf("{cc-bench-%d}:cc", j), 1<<20, time.Minute, holders[j]), 1)
			}
			mid := readRedisStats(b, c)
			if _, err := s.Check(ctx, reqs); err != nil {
				b.Fatal(err)
			}
			after := readRedisStats(b, c)
			acquire += after.usec - mid.usec
			for j := range reqs {
				if _, err := s.Release(ctx, reqs[j].Limits[0].Key, holders[j]); err != nil {
					b.Fatal(err)
				}
			}
			release += readRedisStats(b, c).usec - after.usec
			n += perCall
		}
		b.ReportMetric(float64(acquire)/float64(n), "redis-script-µs/acquire")
		b.ReportMetric(float64(release)/float64(n), "redis-script-µs/release")
	})
	b.Run("memory", func(b *testing.B) {
		places := 100_000
		if v, err := strconv.Atoi(os.Getenv("QUOTAFLOW_MEMBENCH_KEYS")); err == nil && v > 0 {
			places = v
		}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 62, ContextTimeoutEnabled: true})
		defer rdb.Close()
		ctx := context.Background()
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		defer rdb.FlushDB(ctx)
		s := NewStoreWithConfig(rdb, StoreConfig{})
		defer s.Close()
		before := usedMemory(b, rdb)
		const perCall = 1000
		reqs := make([]Request, perCall)
		for done := 0; done < places; done += perCall {
			for i := range reqs {
				p := done + i
				k := "rl:{user:" + strconv.Itoa(p/100) + "}:cc:1m:/api/*"
				reqs[i] = one(ccLimit(k, 1000, time.Hour, fmt.Sprintf("%022d", p)), 1) // a holder's size
			}
			if _, err := s.Check(ctx, reqs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(places), "bytes/place")
	})
}
