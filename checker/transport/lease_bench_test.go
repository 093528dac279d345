package transport

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// hotRules are one global fixed_window rule far above what one Redis core decides (a billion
// per second, never reached), as an ordinary rule and as a leased one.
const hotRules = `rules:
- {id: hot, dimension: global, endpoint: /hot, algorithm: fixed_window, limit: 1000000000, window: 1s}
- {id: hot-leased, dimension: global, endpoint: /hot-leased, algorithm: fixed_window, limit: 1000000000, window: 1s, lease: {slice: 1000}}
`

// BenchmarkHotGlobalKeyRPC measures one hot global key (issue 22, item 3) through the check
// API, CheckRateLimits batches of 64 over Connect on loopback at 16 callers per core, ordinary
// (one script call on the one key per check) and leased (slices of 1000 decided in process).
// The client, the checker and Redis share the machine; cpu-µs/check is the client's and the
// checker's CPU (this process), redis-µs/check Redis's script time (INFO commandstats).
//
//	go test -run='^$' -bench=HotGlobalKeyRPC -benchtime=3s ./checker/transport/
func BenchmarkHotGlobalKeyRPC(b *testing.B) {
	env := newEnv(b, checker.Config{Rules: mustRules(b, hotRules)})
	c := env.client("connect")
	rdb := redisSrv.UniversalClient()
	defer rdb.Close()
	scriptMicros := func() float64 {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") && !strings.HasPrefix(line, "cmdstat_fcall:") {
				continue
			}
			for _, kv := range strings.Split(line[strings.IndexByte(line, ':')+1:], ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					f, _ := strconv.ParseFloat(v, 64)
					total += f
				}
			}
		}
		return total
	}
	const size = 64
	var n atomic.Int64
	for _, tt := range []struct{ name, ep string }{{"ordinary", "/hot"}, {"leased", "/hot-leased"}} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16)
			cpu0, redis0 := processCPU(), scriptMicros()
			b.RunParallel(func(pb *testing.PB) {
				req := &quotaflowv1.CheckRateLimitsRequest{Checks: make([]*quotaflowv1.CheckRateLimitRequest, size)}
				for pb.Next() {
					for i := range req.Checks {
						req.Checks[i] = &quotaflowv1.CheckRateLimitRequest{
							Identifier: "hot-" + strconv.Itoa(int(n.Add(1)%10000)), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: tt.ep}
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
			b.ReportMetric((scriptMicros()-redis0)/float64(b.N*size), "redis-µs/check")
		})
	}
}
