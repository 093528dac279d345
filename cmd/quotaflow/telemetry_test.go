package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
)

// TestTelemetry: /metrics shows the checks and the publisher's counters; with --otlp-endpoint
// every sampled check is a span sent over OTLP/HTTP.
func TestTelemetry(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var spans []string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			t.Errorf("collector got an undecodable export: %v", err)
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans = append(spans, s.Name)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	defer collector.Close()

	instance := "telemetry-" + time.Now().Format("150405000")
	debug := freeAddr(t)
	p := startChecker(t, instance, natsSrv.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.Tracing.OTLPEndpoint, c.Tracing.SampleRatio, c.DebugListen = collector.URL+"/v1/traces", 1, debug
	})
	if resp, err := http.Get("http://" + debug + "/debug/pprof/goroutine?debug=1"); err != nil || resp.StatusCode != 200 {
		t.Errorf("--debug-listen: GET /debug/pprof/goroutine = %v, %v; want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get(p.url + "/debug/pprof/"); err == nil && resp.StatusCode == 200 {
		t.Error("profiles are served on the public port, want only on --debug-listen")
	}
	for i := 0; i < 7; i++ { // 5 allowed, 2 denied (the second from the over-limit cache)
		if _, err := p.client.CheckRateLimit(context.Background(), userCheck(instance+"-u")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var metrics string
	for {
		resp, err := http.Get(p.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		metrics = string(b)
		if strings.Contains(metrics, "quotaflow_publisher_published_total 7") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{
		`quotaflow_checks_total{degraded="false",result="allowed"} 5`,
		`quotaflow_checks_total{degraded="false",result="denied"} 2`,
		`quotaflow_overlimit_cache_hits_total 1`,
		`quotaflow_check_duration_seconds_count{result="allowed"} 5`,
		`quotaflow_redis_duration_seconds_count 6`,
		`quotaflow_publisher_published_total 7`,
		`quotaflow_publisher_dropped_total 0`,
		`quotaflow_publisher_spool_bytes 0`,
		`go_goroutines`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
			for _, l := range strings.Split(metrics, "\n") {
				if strings.HasPrefix(l, "quotaflow_publisher") {
					t.Log(l)
				}
			}
		}
	}
	if err := p.stop(); err != nil { // flushes the spans
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	checks := 0
	for _, s := range spans {
		if s == "quotaflow.check" {
			checks++
		}
	}
	if checks != 7 {
		t.Errorf("collector received %d quotaflow.check spans (of %v), want 7", checks, spans)
	}
}
