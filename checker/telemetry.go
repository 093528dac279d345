package checker

import (
	"context"
	"math/rand/v2"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// instruments are the checker's metrics. Attribute sets are built once: a check adds to
// counters without building attributes.
type instruments struct {
	tracer   trace.Tracer // nil: no tracing
	sample   float64      // share of checks traced
	checks   metric.Int64Counter
	duration metric.Float64Histogram
	redis    metric.Float64Histogram
	cacheHit metric.Int64Counter
	shed     metric.Int64Counter
	// allotted counts checks with a limit decided from a allotted slice; allotUnits the units
	// allotted, allotReturned those given back to Redis unused.
	allotted, allotUnits, allotReturned metric.Int64Counter
	// by result: allowed, denied; and degraded variants. Each is a slice of one option, passed
	// on as it is (opts...): a variadic call with a lone option allocates its slice each time.
	addAllowed, addDenied, addAllowedDegraded, addDeniedDegraded []metric.AddOption
	addDelayed, addDelayedDegraded                               []metric.AddOption
	recAllowed, recDenied                                        []metric.RecordOption
}

// latencyBuckets (seconds) resolve the sub-millisecond range a check lives in.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

func newInstruments(m metric.Meter, t trace.Tracer, ratio float64) (*instruments, error) {
	if m == nil {
		m = metricnoop.NewMeterProvider().Meter("")
	}
	if ratio <= 0 || ratio > 1 {
		ratio = 1
	}
	in := &instruments{tracer: t, sample: ratio}
	var err error
	if in.checks, err = m.Int64Counter("quotaflow.checks", metric.WithDescription("Consuming checks decided, by result (allowed, delayed: allowed after a wait, denied) and whether Redis was unreachable (degraded).")); err != nil {
		return nil, err
	}
	if in.duration, err = m.Float64Histogram("quotaflow.check.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to decide a check inside the checker, Redis round trip included."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return nil, err
	}
	if in.redis, err = m.Float64Histogram("quotaflow.redis.duration", metric.WithUnit("s"),
		metric.WithDescription("Time of a check's Redis call (one pipelined round trip for all its subjects)."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...)); err != nil {
		return nil, err
	}
	if in.cacheHit, err = m.Int64Counter("quotaflow.overlimit_cache.hits", metric.WithDescription("Checks denied from the local over-limit cache without a Redis call.")); err != nil {
		return nil, err
	}
	if in.shed, err = m.Int64Counter("quotaflow.checks.shed", metric.WithDescription(
		"Checks and peeks answered at once by their rules' fail modes, without a Redis call, because the checker had its maximum in flight (overload, not a Redis outage).")); err != nil {
		return nil, err
	}
	// The metrics keep the names they were published under (the rules file's word, lease).
	if in.allotted, err = m.Int64Counter("quotaflow.checks.leased", metric.WithDescription(
		"Checks (and the decisions published for them) with a leased rule decided from this checker's slice of its window, without a Redis call for it.")); err != nil {
		return nil, err
	}
	if in.allotUnits, err = m.Int64Counter("quotaflow.lease.units", metric.WithDescription(
		"Units of leased rules' windows this checker leased from Redis; those it never uses are lost to the window (at most one slice per checker and window).")); err != nil {
		return nil, err
	}
	if in.allotReturned, err = m.Int64Counter("quotaflow.lease.returned", metric.WithDescription(
		"Leased units this checker gave back to Redis unused (a rule change, a changed limit, shutdown).")); err != nil {
		return nil, err
	}
	add := func(result string, degraded bool) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", result), attribute.Bool("degraded", degraded)))}
	}
	rec := func(result string) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", result)))}
	}
	in.addAllowed, in.addAllowedDegraded = add("allowed", false), add("allowed", true)
	in.addDenied, in.addDeniedDegraded = add("denied", false), add("denied", true)
	// A delayed check is allowed after a wait (on_limit: delay): an outcome of its own.
	in.addDelayed, in.addDelayedDegraded = add("delayed", false), add("delayed", true)
	in.recAllowed, in.recDenied = rec("allowed"), rec("denied")
	return in, nil
}

// startSpan starts a span for a sampled check. The decision comes first and costs a random
// draw: a span that a sampler would drop still costs its start, several times this.
func (in *instruments) startSpan(ctx context.Context) (context.Context, trace.Span) {
	if in.tracer == nil || (in.sample < 1 && rand.Float64() >= in.sample) {
		return ctx, nil
	}
	return in.tracer.Start(ctx, "quotaflow.check")
}

// record counts a decided check and its latency.
func (in *instruments) record(ctx context.Context, out *Outcome, start time.Time) {
	var add []metric.AddOption
	var rec []metric.RecordOption
	switch {
	case out.Delay > 0 && !out.Degraded:
		add, rec = in.addDelayed, in.recAllowed
	case out.Delay > 0:
		add, rec = in.addDelayedDegraded, in.recAllowed
	case out.Allowed && !out.Degraded:
		add, rec = in.addAllowed, in.recAllowed
	case out.Allowed:
		add, rec = in.addAllowedDegraded, in.recAllowed
	case !out.Degraded:
		add, rec = in.addDenied, in.recDenied
	default:
		add, rec = in.addDeniedDegraded, in.recDenied
	}
	in.checks.Add(ctx, 1, add...)
	in.duration.Record(ctx, time.Since(start).Seconds(), rec...)
}
