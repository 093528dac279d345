package aggregator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// gauges reads a meter's gauges: name → the value of each attribute set (encoded).
type gauges struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
}

func newGauges(t *testing.T) (gauges, *sdkmetric.MeterProvider) {
	r := sdkmetric.NewManualReader()
	return gauges{t, r}, sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
}

func (g gauges) read() map[string]map[string]float64 {
	g.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := g.reader.Collect(context.Background(), &rm); err != nil {
		g.t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			vals := map[string]float64{}
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					vals[p.Attributes.Encoded(attribute.DefaultEncoder())] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					vals[p.Attributes.Encoded(attribute.DefaultEncoder())] = p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					vals[p.Attributes.Encoded(attribute.DefaultEncoder())] = float64(p.Value)
				}
			default:
				continue
			}
			out[m.Name] = vals
		}
	}
	return out
}

// value is the value of a metric without attributes; ok false when it has none.
func (g gauges) value(name string) (float64, bool) {
	v, ok := g.read()[name][""]
	return v, ok
}

// failingInserts is a ClickHouse connection whose inserts fail while fail is set.
type failingInserts struct {
	driver.Conn
	fail atomic.Bool
}

func (c *failingInserts) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	if c.fail.Load() {
		return nil, errors.New("test: inserts fail")
	}
	return c.Conn.PrepareBatch(ctx, query, opts...)
}

// TestLagMetrics: while ClickHouse refuses the inserts, quotaflow.aggregator.consumer.lag counts
// the messages not stored and quotaflow.aggregator.consumer.lag_seconds grows with the age of the
// oldest of them; once they are stored both are 0 again.
func TestLagMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g, mp := newGauges(t)
	cfg := e.config("lag")
	cfg.Meter = mp.Meter("test")
	ch := &failingInserts{Conn: e.ch}
	a, _ := e.startOn(ch, cfg)
	e.publish(200, 20)
	e.waitStored(200)
	caughtUp := func() bool {
		lag, ok1 := g.value("quotaflow.aggregator.consumer.lag")
		age, ok2 := g.value("quotaflow.aggregator.consumer.lag_seconds")
		return ok1 && ok2 && lag == 0 && age == 0
	}
	poll.Until(t, time.Minute, "lag 0 once caught up", poll.True(caughtUp)) // measured every second

	ch.fail.Store(true)
	start := time.Now()
	e.publish(200, 20)
	poll.Until(t, time.Minute, "lag_seconds past 1s while inserts fail", poll.True(func() bool {
		age, _ := g.value("quotaflow.aggregator.consumer.lag_seconds")
		return age >= 1
	}))
	age, _ := g.value("quotaflow.aggregator.consumer.lag_seconds")
	if elapsed := time.Since(start).Seconds(); age > elapsed {
		t.Errorf("lag_seconds %.2f, more than the %.2fs since the first message not stored was published", age, elapsed)
	}
	if lag, _ := g.value("quotaflow.aggregator.consumer.lag"); lag == 0 {
		t.Error("consumer.lag 0 while inserts fail")
	}
	if errs, _ := g.value("quotaflow.aggregator.clickhouse.errors"); errs == 0 || a.Stats().LagAge < time.Second {
		t.Errorf("clickhouse.errors %v, Stats %+v: want failed inserts counted and LagAge past 1s", errs, a.Stats())
	}

	ch.fail.Store(false)
	e.waitStored(400)
	poll.Until(t, time.Minute, "lag 0 once the backlog is stored", poll.True(caughtUp))
}

// TestTierProtectionGauges: the leader's evaluation of a tier_protection policy reports the tier's
// allowed checks and capacity (attribute tier); an aggregator that is not the leader, or whose
// count failed, reports none.
func TestTierProtectionGauges(t *testing.T) {
	t.Parallel()
	store, js, set := policyStore(t) // tier free: capacity 100 over 2s
	g, mp := newGauges(t)
	var rate atomic.Int64
	rate.Store(250)
	var countFails, leader atomic.Bool
	leader.Store(true)
	runPolicies(t, aggregator.PolicyConfig{
		Rules: func() *rules.Set { return set }, Store: store, JetStream: js, Interval: 50 * time.Millisecond,
		Leader: leader.Load, Meter: mp.Meter("test"),
		TierRate: func(_ context.Context, tier string, _ time.Time) (int64, error) {
			if countFails.Load() {
				return 0, errors.New("test: count fails")
			}
			return rate.Load(), nil
		},
	})
	freeSet := attribute.NewSet(attribute.String("tier", "free"))
	free := freeSet.Encoded(attribute.DefaultEncoder())
	reports := func(allowed, capacity float64) func() bool {
		return func() bool {
			m := g.read()
			a, ok1 := m["quotaflow.aggregator.tier.allowed"][free]
			c, ok2 := m["quotaflow.aggregator.tier.capacity"][free]
			return ok1 && ok2 && a == allowed && c == capacity && len(m["quotaflow.aggregator.tier.allowed"]) == 1
		}
	}
	silent := func() bool {
		m := g.read()
		return len(m["quotaflow.aggregator.tier.allowed"]) == 0 && len(m["quotaflow.aggregator.tier.capacity"]) == 0
	}
	poll.Until(t, time.Minute, "tier free reported above its capacity (250 > 100)", poll.True(reports(250, 100)))
	rate.Store(40)
	poll.Until(t, time.Minute, "tier free reported below its capacity (40)", poll.True(reports(40, 100)))
	countFails.Store(true)
	poll.Until(t, time.Minute, "no report while the count fails", poll.True(silent))
	countFails.Store(false)
	poll.Until(t, time.Minute, "tier free reported again", poll.True(reports(40, 100)))
	leader.Store(false)
	poll.Until(t, time.Minute, "no report from an aggregator that is not the leader", poll.True(silent))
}
