package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/internal/telemetry"
	"github.com/quotaflow/quotaflow/publisher"
)

// withMetrics serves /metrics (Prometheus format) beside h.
func withMetrics(h http.Handler, tel *telemetry.Telemetry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.Metrics)
	mux.Handle("/", h)
	return mux
}

// observePublisher exports the publisher's counters: what it queued, published, spooled,
// replayed and dropped (dropped must stay 0), and the spool's size.
func observePublisher(m metric.Meter, pub *publisher.Client) error {
	counter := func(name, desc string, get func(publisher.Stats) int64) (metric.Int64ObservableCounter, error) {
		return m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithInt64Callback(
			func(_ context.Context, o metric.Int64Observer) error { o.Observe(get(pub.Stats())); return nil }))
	}
	gauge := func(name, desc string, get func(publisher.Stats) int64) (metric.Int64ObservableGauge, error) {
		return m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithInt64Callback(
			func(_ context.Context, o metric.Int64Observer) error { o.Observe(get(pub.Stats())); return nil }))
	}
	var errs []error
	add := func(_ any, err error) { errs = append(errs, err) }
	add(counter("quotaflow.publisher.published", "Decisions published to the stream directly.", func(s publisher.Stats) int64 { return s.Published }))
	add(counter("quotaflow.publisher.spooled", "Decisions written to the on-disk spool (NATS slow or down, or queue full).", func(s publisher.Stats) int64 { return s.Spooled }))
	add(counter("quotaflow.publisher.replayed", "Decisions published from the spool.", func(s publisher.Stats) int64 { return s.Replayed }))
	add(counter("quotaflow.publisher.dropped", "Decisions lost because the spool was full. Must stay 0.", func(s publisher.Stats) int64 { return s.Dropped }))
	add(gauge("quotaflow.publisher.queued", "Decisions in memory, not yet sent or spooled.", func(s publisher.Stats) int64 { return s.Queued }))
	add(gauge("quotaflow.publisher.pending", "Decisions sent and awaiting the stream's ack.", func(s publisher.Stats) int64 { return s.Pending }))
	add(gauge("quotaflow.publisher.spool_bytes", "Bytes in the spool not yet published.", func(s publisher.Stats) int64 { return s.SpoolBytes }))
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("publisher metrics: %w", err)
		}
	}
	return nil
}

// serveDebug serves Go's profiles (/debug/pprof) on their own address, apart from the public
// port; the returned function stops it.
func serveDebug(ctx context.Context, addr string, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	log.Info("profiles served", "url", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { hs.Close() }, nil
}
