package transport

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

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

// BenchmarkRLSDomains measures ShouldRateLimit over gRPC on loopback for one descriptor of
// 10,000 values: in quotaflow's own domain (a user_id entry, a user rule) and in an imported
// envoyproxy/ratelimit domain (a remote_address entry, a counted descriptor rule), whose
// answer the transport renders as the reference service does.
func BenchmarkRLSDomains(b *testing.B) {
	env := newEnv(b, checker.Config{Rules: mustRules(b, `rules:
- {id: user, dimension: user, endpoint: /quotaflow, algorithm: fixed_window, limit: 1000000000, window: 1m}
- {id: addr, dimension: descriptor, descriptor: [{key: remote_address}], endpoint: /edge, algorithm: fixed_window, limit: 1000000000, window: 1m, count_denied: true}
`)})
	c := grpcRLSClient(b, strings.TrimPrefix(env.url, "http://"))
	for _, bc := range []struct{ name, domain, key string }{
		{"quotaflow", "quotaflow", "user_id"},
		{"imported", "edge", "remote_address"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := &ratelimitv3.RateLimitRequest{Domain: bc.domain, Descriptors: []*rlcommonv3.RateLimitDescriptor{
						{Entries: entries(bc.key, "v"+strconv.Itoa(int(n.Add(1)%10000)))}}}
					resp, err := c.ShouldRateLimit(context.Background(), req)
					if err != nil || resp.GetOverallCode() != ratelimitv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() == nil {
						b.Fatalf("%v: %v, %v", req, resp, err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
