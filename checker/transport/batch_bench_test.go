package transport

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// processCPU is this process's CPU time (user + system): the client's and the checker's, which
// the benchmarks run in one process; Redis runs in its own.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCheckRateLimits compares CheckRateLimits batches of 1, 8 and 64 checks with single
// CheckRateLimit calls, over Connect on loopback at the same concurrency as BenchmarkCheckRPC
// (16 callers per core). An op is one RPC; checks/s counts the checks decided, cpu-µs/check the
// CPU of the client and the checker per check (both in this process).
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
		cpu0 := processCPU()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(check()))
				if err != nil || !resp.Msg.Allowed {
					b.Fatalf("check: %v", err)
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N), "cpu-µs/check")
	})
	for _, size := range []int{1, 8, 64} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			cpu0 := processCPU()
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
			b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N*size), "cpu-µs/check")
		})
	}
}
