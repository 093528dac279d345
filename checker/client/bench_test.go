package client_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/client"
)

// BenchmarkCheck measures Client.Check against a real checker at 16 callers per core, each
// check its own, with coalescing off (one CheckRateLimit per check) and on.
func BenchmarkCheck(b *testing.B) {
	url, stop := exampleChecker()
	defer stop()
	for _, tt := range []struct {
		name string
		wait time.Duration
	}{{"single", -1}, {"coalesced", 0}} {
		b.Run(tt.name, func(b *testing.B) {
			c := client.New(url, client.Config{BatchWait: tt.wait, Timeout: 5 * time.Second})
			defer c.Close()
			var n atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: "bench-" + run + "-" + strconv.FormatInt(n.Add(1), 10)}}, Endpoint: "/big"}
					d, err := c.Check(context.Background(), req)
					if err != nil || !d.Allowed || d.Source != client.SourceChecker {
						b.Fatalf("check = %+v, %v; want allowed by the checker", d, err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
