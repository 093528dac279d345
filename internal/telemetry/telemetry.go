// Package telemetry sets up quotaflow's OpenTelemetry: metrics exported in Prometheus format
// (served at /metrics) and, when an OTLP endpoint is configured, traces sent over OTLP/HTTP;
// and its processes' loggers (NewLogger), so that every daemon logs alike.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Config configures Setup. The zero value gives metrics and no traces.
type Config struct {
	// Service and Instance name the process in metrics and traces.
	Service  string
	Instance string
	// OTLPEndpoint is the OTLP/HTTP traces endpoint URL (e.g. http://collector:4318/v1/traces);
	// empty means no traces.
	OTLPEndpoint string
	// SampleRatio is the share of checks traced when OTLPEndpoint is set (0 means 0.01).
	SampleRatio float64
}

// Telemetry holds the providers; Close flushes them.
type Telemetry struct {
	// Instance names the process (Config.Instance): its components use it too, in decision
	// ids, events and consumer names, so that logs, metrics and data agree.
	Instance string
	// Meter creates the process's instruments.
	Meter metric.Meter
	// Tracer creates spans; nil when no OTLP endpoint is configured. Its provider records every
	// span it is asked for: callers decide what to trace with TraceRatio before starting one,
	// because starting a span, even one a sampler then drops, costs more than a check's budget.
	Tracer trace.Tracer
	// TraceRatio is the share of checks to trace (Config.SampleRatio, or 0.01).
	TraceRatio float64
	// Metrics serves the Prometheus exposition of every instrument, plus Go runtime metrics.
	Metrics http.Handler

	meters *sdkmetric.MeterProvider
	traces *sdktrace.TracerProvider
}

// Setup builds the meter provider with a Prometheus exporter on its own registry, and the
// tracer provider when cfg.OTLPEndpoint is set.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	if cfg.Service == "" {
		cfg.Service = "quotaflow"
	}
	res := resource.NewSchemaless(semconv.ServiceName(cfg.Service), semconv.ServiceInstanceID(cfg.Instance))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t := &Telemetry{
		Instance: cfg.Instance,
		meters:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res)),
		Metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}
	t.Meter = t.meters.Meter("github.com/quotaflow/quotaflow")
	if cfg.OTLPEndpoint != "" {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.OTLPEndpoint))
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		t.TraceRatio = cfg.SampleRatio
		if t.TraceRatio <= 0 {
			t.TraceRatio = 0.01
		}
		t.traces = sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(exp),
			sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.AlwaysSample()),
		)
		t.Tracer = t.traces.Tracer("github.com/quotaflow/quotaflow")
	}
	return t, nil
}

// Close flushes pending spans and stops the providers.
func (t *Telemetry) Close(ctx context.Context) error {
	var errs []error
	if t.traces != nil {
		errs = append(errs, t.traces.Shutdown(ctx))
	}
	errs = append(errs, t.meters.Shutdown(ctx))
	return errors.Join(errs...)
}
