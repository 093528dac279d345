package checker

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
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
			e := newEngine(t, Config{Tracer: tp.Tracer("test"), TraceRatio: tt.ratio})
			for i := 0; i < 400; i++ {
				if _, err := e.Check(context.Background(), userQuery(checkertest.ID(t, "u"), "/unlimited")); err != nil {
					t.Fatal(err)
				}
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
	e := newEngine(t, Config{})
	if e.tel.tracer != nil {
		t.Error("tracer set without Config.Tracer")
	}
	if _, span := e.tel.startSpan(context.Background()); span != nil {
		t.Error("startSpan without a tracer returned a span")
	}
}

// failingMeter is a meter whose counters cannot be created.
type failingMeter struct{ noop.Meter }

func (failingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return nil, errors.New("no counters here")
}

// TestNewWithoutLoggerMetricsFail: an engine whose instruments cannot be created logs it on
// the default logger (it has none of its own) and runs without metrics.
func TestNewWithoutLoggerMetricsFail(t *testing.T) {
	rdb := checkertest.Redis(redisSrv.Addr)
	defer rdb.Close()
	e := New(Config{Redis: rdb, Rules: mustRules(t, testRules), Meter: failingMeter{}, RedisTimeout: 5 * time.Second})
	defer e.Close()
	if _, err := e.Check(context.Background(), userQuery(checkertest.ID(t, "u"), "/api/x")); err != nil {
		t.Fatalf("check without metrics: %v", err)
	}
}
