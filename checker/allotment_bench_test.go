package checker

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// hotRules are one global fixed_window rule far above what one Redis core decides (a billion
// per second, never reached), as an ordinary rule and as a allotted one.
const hotRules = `rules:
- {id: hot, dimension: global, endpoint: /hot, algorithm: fixed_window, limit: 1000000000, window: 1s}
- {id: hot-leased, dimension: global, endpoint: /hot-leased, algorithm: fixed_window, limit: 1000000000, window: 1s, lease: {slice: 1000}}
`

// BenchmarkHotGlobalKey measures Engine.Check of one hot global key (issue 22, item 3): every
// check of every caller counts against one bucket, ordinary (one script call on that one key
// per check, so one Redis core decides them all) and allotted (one allotment call per slice of 1000,
// the checks decided in process). The checks are of users no rule counts, as a gateway's.
//
//	go test -run='^$' -bench=HotGlobalKey -benchtime=3s ./checker/
func BenchmarkHotGlobalKey(b *testing.B) {
	for _, c := range []struct{ name, ep string }{{"ordinary", "/hot"}, {"leased", "/hot-leased"}} {
		b.Run(c.name, func(b *testing.B) {
			e := newEngine(b, Config{Rules: mustRules(b, hotRules)})
			rdb := checkertest.Redis(redisSrv.Addr)
			defer rdb.Close()
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			before := scriptMicros(b, rdb)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := e.Check(context.Background(), userQuery("bench-"+strconv.Itoa(int(n.Add(1)%10000)), c.ep))
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
