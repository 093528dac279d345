package publisher

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// observe exports the client's counters: what it queued, published, spooled, replayed and
// dropped (dropped must stay 0), the checks answered before their decision was spooled, and
// the spool's size.
func (c *Client) observe(m metric.Meter) error {
	counter := func(name, desc string, get func(Stats) int64) (metric.Int64ObservableCounter, error) {
		return m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithInt64Callback(
			func(_ context.Context, o metric.Int64Observer) error { o.Observe(get(c.Stats())); return nil }))
	}
	gauge := func(name, desc string, get func(Stats) int64) (metric.Int64ObservableGauge, error) {
		return m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithInt64Callback(
			func(_ context.Context, o metric.Int64Observer) error { o.Observe(get(c.Stats())); return nil }))
	}
	var errs []error
	add := func(_ any, err error) { errs = append(errs, err) }
	add(counter("quotaflow.publisher.published", "Decisions acked by the stream when first sent (directly, or through the spool for an answer that waits for it).", func(s Stats) int64 { return s.Published }))
	add(counter("quotaflow.publisher.spooled", "Decisions written to the on-disk spool (NATS slow or down, or queue full).", func(s Stats) int64 { return s.Spooled }))
	add(counter("quotaflow.publisher.replayed", "Decisions acked by the stream when sent again from the spool, where they waited for NATS.", func(s Stats) int64 { return s.Replayed }))
	add(counter("quotaflow.publisher.dropped", "Decisions lost because the spool was full. Must stay 0.", func(s Stats) int64 { return s.Dropped }))
	add(counter("quotaflow.publisher.unspooled", "Checks answered before their decision was in the spool (its write failed or took longer than the spool wait): a kill -9 could lose them. Stays 0 on a healthy disk.", func(s Stats) int64 { return s.Unspooled }))
	add(gauge("quotaflow.publisher.queued", "Decisions in memory, not yet sent or spooled.", func(s Stats) int64 { return s.Queued }))
	add(gauge("quotaflow.publisher.pending", "Decisions sent and awaiting the stream's ack.", func(s Stats) int64 { return s.Pending }))
	add(gauge("quotaflow.publisher.spool_bytes", "Bytes in the spool not yet published.", func(s Stats) int64 { return s.SpoolBytes }))
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
