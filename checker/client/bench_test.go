package client_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/client"
)

// BenchmarkCheck measures Client.Check against a real checker, each check its own: at 16
// callers per core with coalescing off (one CheckRateLimit per check) and on, and from one
// caller, whose checks never find a batch in flight to wait for.
func BenchmarkCheck(b *testing.B) {
	url, stop := exampleChecker()
	defer stop()
	for _, tt := range []struct {
		name    string
		wait    time.Duration
		callers int // per core; 0: one caller in all
	}{{"single", -1, 16}, {"coalesced", 0, 16}, {"single/one caller", -1, 0}, {"coalesced/one caller", 0, 0}} {
		b.Run(tt.name, func(b *testing.B) {
			c := client.New(url, client.Config{BatchWait: tt.wait, Timeout: 5 * time.Second})
			defer c.Close()
			var n atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			check := func() {
				req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: "bench-" + run + "-" + strconv.FormatInt(n.Add(1), 10)}}, Endpoint: "/big"}
				d, err := c.Check(context.Background(), req)
				if err != nil || !d.Allowed || d.Source != client.SourceChecker {
					b.Fatalf("check = %+v, %v; want allowed by the checker", d, err)
				}
			}
			b.ReportAllocs()
			if tt.callers == 0 {
				for b.Loop() {
					check()
				}
			} else {
				b.SetParallelism(tt.callers)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						check()
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
