package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"
	"github.com/quotaflow/quotaflow/internal/stream"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
)

type instruments struct {
	inserted, skipped, clickhouseErrors metric.Int64Counter
	transitions, eventsStored           metric.Int64Counter
	insertDuration                      metric.Float64Histogram
}

func newInstruments(m metric.Meter, a *Aggregator) (*instruments, error) {
	var in instruments
	var err error
	if in.inserted, err = m.Int64Counter("quotaflow.aggregator.decisions.inserted",
		metric.WithDescription("Decisions stored in ClickHouse.")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if in.skipped, err = m.Int64Counter("quotaflow.aggregator.decisions.skipped",
		metric.WithDescription("Redelivered decisions skipped because they were already stored.")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if in.clickhouseErrors, err = m.Int64Counter("quotaflow.aggregator.clickhouse.errors",
		metric.WithDescription("Failed ClickHouse inserts and lookups (each is retried).")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if in.transitions, err = m.Int64Counter("quotaflow.aggregator.warning.transitions",
		metric.WithDescription("Warning-state transitions published (attributes from and to); a copy the events stream dropped as a duplicate is not counted.")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if in.eventsStored, err = m.Int64Counter("quotaflow.aggregator.events.stored",
		metric.WithDescription("Events stored in ClickHouse (attribute kind: warning or override).")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if in.insertDuration, err = m.Float64Histogram("quotaflow.aggregator.insert.duration",
		metric.WithUnit("s"), metric.WithDescription("Duration of successful inserts."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	lag, err := m.Int64ObservableGauge("quotaflow.aggregator.consumer.lag",
		metric.WithDescription("Stream messages (batches of decisions) not yet stored on the partitions this aggregator owns."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	lagAge, err := m.Float64ObservableGauge("quotaflow.aggregator.consumer.lag_seconds", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest stream message (batch of decisions) not yet stored on the partitions this aggregator owns, from the time the stream received it; 0 when caught up."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	owned, err := m.Int64ObservableGauge("quotaflow.aggregator.partitions.owned",
		metric.WithDescription("Partitions this aggregator consumes."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if _, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := a.Stats()
		o.ObserveInt64(lag, s.Lag)
		o.ObserveFloat64(lagAge, s.LagAge.Seconds())
		o.ObserveInt64(owned, int64(s.Owned))
		return nil
	}, lag, lagAge, owned); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return &in, nil
}

// lagLoop measures the owned partitions' backlog: messages not yet delivered plus those
// delivered and not yet acked (a message is acked once stored), and the age of the oldest of
// them (lagAge).
func (a *Aggregator) lagLoop(ctx context.Context) {
	tick := time.NewTicker(max(a.cfg.Heartbeat, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a.mu.Lock()
		var ps []int
		for p := range a.owned {
			ps = append(ps, p)
		}
		a.mu.Unlock()
		var lag int64
		var oldest time.Time // stream time of the oldest message not stored; zero: none
		var str jetstream.Stream
		ok := true
		for _, p := range ps {
			cctx, cancel := apiContext(ctx)
			cons, err := a.js.Consumer(cctx, a.cfg.Stream, ConsumerName(p))
			cancel()
			if err != nil {
				ok = false
				break
			}
			info := cons.CachedInfo()
			n := int64(info.NumPending) + int64(info.NumAckPending)
			lag += n
			if n == 0 {
				continue
			}
			at, err := a.firstUnacked(ctx, &str, p, info.AckFloor.Stream)
			if err != nil {
				ok = false
				break
			}
			if !at.IsZero() && (oldest.IsZero() || at.Before(oldest)) {
				oldest = at
			}
		}
		if ok {
			a.lag.Store(lag)
			var age time.Duration
			if !oldest.IsZero() {
				age = max(0, time.Since(oldest))
			}
			a.lagAge.Store(int64(age))
		}
	}
}

// firstUnacked returns the time the stream received partition p's first message past its
// consumer's ack floor (stream sequence floor): every message before it is stored, and it is
// not (yet). Zero when there is none (acked meanwhile, or removed by the stream's limits).
// *str caches the stream across the partitions of one measurement.
func (a *Aggregator) firstUnacked(ctx context.Context, str *jetstream.Stream, p int, floor uint64) (time.Time, error) {
	cctx, cancel := apiContext(ctx)
	defer cancel()
	if *str == nil {
		s, err := a.js.Stream(cctx, a.cfg.Stream)
		if err != nil {
			return time.Time{}, err
		}
		*str = s
	}
	msg, err := (*str).GetMsg(cctx, floor+1, jetstream.WithGetMsgSubject(stream.Subject(a.cfg.SubjectPrefix, p)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return msg.Time, nil
}

// retentionLoop drops expired partitions now and every RetentionInterval.
func (a *Aggregator) retentionLoop(ctx context.Context) {
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		dropped, err := a.layout().ApplyRetention(rctx, a.ch, a.cfg.Database, time.Now())
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			a.log.Warn("retention job failed; it runs again at the next interval", "err", err)
		case len(dropped) > 0:
			a.log.Info("retention job dropped expired partitions", "dropped", fmt.Sprint(dropped))
		}
		if !retry.Sleep(ctx, a.cfg.RetentionInterval) {
			return
		}
	}
}
