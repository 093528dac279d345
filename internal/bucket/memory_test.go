package bucket

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// BenchmarkRedisMemoryPerKey measures Redis memory per bucket for each algorithm: it fills an
// empty database with QUOTAFLOW_MEMBENCH_KEYS buckets (default 1,000,000) of one limit each,
// keyed as the checker keys them, and divides the growth of INFO memory's used_memory by the
// number of buckets, once per Layout (StoreConfig.Layout; sub-benchmarks <algorithm>/<layout>).
// It ignores b.N: run it once, with -benchtime=1x.
//
//	go test -run='^$' -bench=RedisMemoryPerKey -benchtime=1x -timeout=30m ./internal/bucket/
func BenchmarkRedisMemoryPerKey(b *testing.B) {
	keys := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("QUOTAFLOW_MEMBENCH_KEYS")); err == nil && v > 0 {
		keys = v
	}
	for _, a := range allAlgorithms {
		for l := range layouts {
			b.Run(a.String()+"/"+l.String(), func(b *testing.B) { memoryPerKey(b, a, l, keys) })
		}
	}
}

// memoryPerKey fills DB 63 with keys buckets of algorithm a written in layout l and reports the
// growth of used_memory per key.
func memoryPerKey(b *testing.B, a algorithm.ID, l Layout, keys int) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 63, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	defer rdb.FlushDB(ctx)
	s := NewStoreWithConfig(rdb, StoreConfig{Layout: l})
	defer s.Close()
	before := usedMemory(b, rdb)
	const perCall = 1000
	reqs := make([]Request, perCall)
	for done := 0; done < keys; done += perCall {
		for i := range reqs {
			// Long windows: no key expires while the database fills.
			key := "rl:{user:" + strconv.Itoa(done+i) + "}:" + a.Code() + ":1d:/api/*"
			reqs[i] = Request{Cost: 1, Limits: []Limit{{Key: key, Algorithm: a, Limit: 1000, Window: 24 * time.Hour}}}
		}
		if _, err := s.Check(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
	n, err := rdb.DBSize(ctx).Result()
	if l == LayoutShared && inShared(reqs[0].Limits[0]) {
		// The buckets are fields of shared hashes, each with its "~".
		n, err = rdb.Eval(ctx, `local n = 0
			for _, k in ipairs(redis.call('KEYS', '*')) do n = n + redis.call('HLEN', k) - 1 end
			return n`, nil).Int64()
	}
	if err != nil || n != int64(keys) {
		b.Fatalf("database holds %d buckets (%v), want %d", n, err, keys)
	}
	b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(keys), "bytes/key")
	b.ReportMetric(float64(keys), "keys")
}

// usedMemory is redistest.UsedMemory, failing b on an error.
func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	n, err := redistest.UsedMemory(context.Background(), rdb)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
