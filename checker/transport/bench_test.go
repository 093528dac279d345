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

const benchRules = `rules:
- {id: one, dimension: user, endpoint: /one, algorithm: token_bucket, limit: 1000000000, window: 1s}
`

// BenchmarkCheckRPC measures CheckRateLimit end to end over Connect on loopback.
func BenchmarkCheckRPC(b *testing.B) {
	env := newEnv(b, checker.Config{Rules: mustRules(b, benchRules)})
	c := env.client("connect")
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Identifier: "rpc-" + strconv.Itoa(int(n.Add(1)%10000)), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/one"}))
			if err != nil || !resp.Msg.Allowed {
				b.Fatalf("check: %v", err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}
