package bucket

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// benchLimits returns n limits of mixed algorithms for one subject, large enough never to
// deny, so the benchmark measures the allowed path.
func benchLimits(prefix string, n int) []Limit {
	algs := []Algorithm{GCRA, TokenBucket, SlidingWindowCounter}
	ls := make([]Limit, n)
	for i := range ls {
		ls[i] = lim(fmt.Sprintf("{%s}:%d", prefix, i), algs[i%len(algs)], 1<<40, time.Hour, 0)
	}
	return ls
}

func BenchmarkStoreCheck(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("limits=%d", n), func(b *testing.B) {
			s, _ := newStore(b)
			var id atomic.Int64
			// Checks wait on the network most of the time: a server has many in flight.
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// One subject per goroutine, as distinct callers would be.
				req := []Request{{Limits: benchLimits(fmt.Sprintf("bench-%d-%d", n, id.Add(1)), n), Cost: 1}}
				ctx := context.Background()
				for pb.Next() {
					if _, err := s.Check(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

func BenchmarkLocalCheck(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("limits=%d", n), func(b *testing.B) {
			loc := NewLocal(0)
			var id atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := Request{Limits: benchLimits(fmt.Sprintf("bench-%d", id.Add(1)), n), Cost: 1}
				now := time.Now()
				for pb.Next() {
					now = now.Add(time.Microsecond)
					loc.Check(now, req)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
