package aggregator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// BenchmarkStreamToClickHouse measures decisions/s from the stream into ClickHouse in one
// process: b.N decisions published beforehand in 512-decision messages (the publisher's
// batch), then consumed, inserted (with their rollups) and acked. Its decisions are the warning
// states' worst case: four subjects, each denied every third decision with no retry-after, so
// that nearly every decision is a transition to publish.
func BenchmarkStreamToClickHouse(b *testing.B) { benchStream(b, nil) }

// BenchmarkStreamToClickHouseNormal is the same with ordinary traffic: 10,000 subjects, all
// allowed, none above the warning threshold (no transition).
func BenchmarkStreamToClickHouseNormal(b *testing.B) {
	i := 0
	benchStream(b, func(d *quotaflowv1.Decision) {
		i++
		d.Allowed = true
		for _, l := range d.Limits {
			l.Identifier, l.Allowed, l.CurrentCount = fmt.Sprintf("u%d", i%10000), true, int64(i%7)
		}
	})
}

func benchStream(b *testing.B, edit func(*quotaflowv1.Decision)) {
	e := newEnv(b)
	n := max(b.N, 1000)
	e.publishEdited(n, 512, edit)
	cfg := e.config("bench")
	cfg.BatchRows, cfg.FlushInterval = 50000, 200*time.Millisecond
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	a, _ := e.startWith(cfg)
	for e.count("SELECT count() FROM %s.decisions") < uint64(n) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(a.Stats().Transitions), "transitions")
	// The audit's cost on disk, for the capacity model (docs/scaling.md): compressed bytes of
	// the decisions table per row, once its parts are merged.
	if err := e.ch.Exec(context.Background(), fmt.Sprintf("OPTIMIZE TABLE %s.decisions FINAL", e.db)); err != nil {
		b.Logf("optimize: %v", err)
	}
	var bytes, rows uint64
	if err := e.ch.QueryRow(context.Background(), "SELECT sum(bytes_on_disk), sum(rows) FROM system.parts WHERE database = ? AND table = 'decisions' AND active",
		e.db).Scan(&bytes, &rows); err == nil && rows > 0 {
		b.ReportMetric(float64(bytes)/float64(rows), "disk-bytes/decision")
	} else {
		b.Logf("decisions on disk: %v (%d rows)", err, rows)
	}
}
