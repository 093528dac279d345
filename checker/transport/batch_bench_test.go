package transport

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// BenchmarkCheckRateLimits compares CheckRateLimits batches of 1, 8 and 64 checks with single
// CheckRateLimit calls, over Connect on loopback at the same concurrency as BenchmarkCheckRPC
// (16 callers per core). An op is one RPC; checks/s counts the checks decided.
func BenchmarkCheckRateLimits(b *testing.B) {
	env := newEnv(b, checker.Config{Rules: mustRules(b, benchRules)})
	c := env.client("connect")
	var n atomic.Int64
	check := func() *quotaflowv1.CheckRateLimitRequest {
		return &quotaflowv1.CheckRateLimitRequest{
			Identifier: "batch-" + strconv.Itoa(int(n.Add(1)%10000)), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/one"}
	}
	b.Run("single", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(check()))
				if err != nil || !resp.Msg.Allowed {
					b.Fatalf("check: %v", err)
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
	})
	for _, size := range []int{1, 8, 64} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				req := &quotaflowv1.CheckRateLimitsRequest{Checks: make([]*quotaflowv1.CheckRateLimitRequest, size)}
				for pb.Next() {
					for i := range req.Checks {
						req.Checks[i] = check()
					}
					resp, err := c.CheckRateLimits(context.Background(), connect.NewRequest(req))
					if err != nil {
						b.Fatalf("batch: %v", err)
					}
					for i, r := range resp.Msg.Results {
						if !r.GetResponse().GetAllowed() {
							b.Fatalf("checks[%d] = %v, want allowed", i, r)
						}
					}
				}
			})
			b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
