package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/telemetry"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/publisher"
)

// benchRules is one token-bucket limit far above what a benchmark spends.
const benchRules = "rules:\n- {id: one, dimension: user, endpoint: /one, algorithm: token_bucket, limit: 1000000000, window: 1s}\n"

// newBenchConfig returns the checker configuration both benchmarks start from: the bench rules
// on database db of the package's Redis, quiet logs.
func newBenchConfig(b *testing.B, db int) checker.Config {
	b.Helper()
	set, err := rules.Parse([]byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr, DB: db, ContextTimeoutEnabled: true})
	b.Cleanup(func() { rdb.Close() })
	return checker.Config{Redis: rdb, Rules: set, RedisTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// runChecks calls CheckRateLimit in process (no HTTP) from 8 goroutines per core over 10k
// subjects for b.N checks, and reports checks/s.
func runChecks(b *testing.B, cfg checker.Config) {
	b.Helper()
	engine := checker.New(cfg)
	defer engine.Close()
	srv := transport.New(engine, transport.Config{})
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := srv.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Identifier: "bench-" + strconv.Itoa(int(n.Add(1)%10000)), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/one"}))
			if err != nil || !resp.Msg.Allowed {
				b.Fatalf("check: %v", err)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
}

// BenchmarkCheckPublish measures checker throughput with publishing off and on in the same run,
// every decision going through publisher.Client to the embedded JetStream server: answered
// after its decision is written to the spool (publish=spool, the default), or at once with
// the decision batched in memory (publish=memory, --spool-wait 0).
func BenchmarkCheckPublish(b *testing.B) {
	for _, mode := range []string{"off", "memory", "spool"} {
		b.Run("publish="+mode, func(b *testing.B) {
			cfg := newBenchConfig(b, 7)
			if mode == "off" {
				runChecks(b, cfg)
				return
			}
			nc, err := natsSrv.Connect()
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			name := mode + strconv.Itoa(b.N)
			pub, err := publisher.New(nc, publisher.Config{Stream: "BENCH_" + name, SubjectPrefix: "bench." + name,
				SpoolDir: b.TempDir(), NoSpoolWait: mode == "memory", Logger: cfg.Logger})
			if err != nil {
				b.Fatal(err)
			}
			cfg.Decisions = pub
			runChecks(b, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := pub.Close(ctx); err != nil {
				b.Fatal(err)
			}
			if st := pub.Stats(); st.Dropped != 0 || st.Unspooled != 0 || st.Published+st.Replayed != int64(b.N) {
				b.Fatalf("publisher stats %+v, want all %d decisions published and none dropped or unspooled", st, b.N)
			}
		})
	}
}

// BenchmarkCheckTelemetry measures checker throughput with telemetry off, with metrics, and
// with metrics plus traces (1% sampled, exported over OTLP/HTTP to a collector that discards).
func BenchmarkCheckTelemetry(b *testing.B) {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	defer collector.Close()
	for _, mode := range []string{"off", "metrics", "metrics+traces"} {
		b.Run("telemetry="+mode, func(b *testing.B) {
			cfg := newBenchConfig(b, 8)
			if mode != "off" {
				tc := telemetry.Config{}
				if mode == "metrics+traces" {
					tc.OTLPEndpoint, tc.SampleRatio = collector.URL+"/v1/traces", 0.01
				}
				tel, err := telemetry.Setup(context.Background(), tc)
				if err != nil {
					b.Fatal(err)
				}
				defer tel.Close(context.Background())
				cfg.Meter, cfg.Tracer, cfg.TraceRatio = tel.Meter, tel.Tracer, tel.TraceRatio
			}
			runChecks(b, cfg)
		})
	}
}
