package checker

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTraceSampling: the checker decides which checks to trace before starting a span; a
// tracer records exactly the sampled share.
func TestTraceSampling(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		ratio    float64
		min, max int // spans for 400 checks
	}{
		{"all", 1, 400, 400},
		{"zero means all", 0, 400, 400},
		{"a quarter", 0.25, 50, 150},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			env := newEnv(t, Config{Tracer: tp.Tracer("test"), TraceRatio: tt.ratio})
			c := env.client("connect")
			for i := 0; i < 400; i++ {
				mustCheck(t, c, checkReq(id(t, "u"), "/unlimited"))
			}
			tp.ForceFlush(context.Background())
			spans := exp.GetSpans()
			if len(spans) < tt.min || len(spans) > tt.max {
				t.Errorf("%d spans for 400 checks at ratio %v, want %d to %d", len(spans), tt.ratio, tt.min, tt.max)
			}
			for _, s := range spans {
				if s.Name != "quotaflow.check" {
					t.Errorf("span %q, want quotaflow.check", s.Name)
				}
			}
		})
	}
	// Without a tracer there is no span machinery at all.
	env := newEnv(t, Config{})
	if env.srv.tel.tracer != nil {
		t.Error("tracer set without Config.Tracer")
	}
	if _, span := env.srv.tel.startSpan(context.Background()); span != nil {
		t.Error("startSpan without a tracer returned a span")
	}
}
