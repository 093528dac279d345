package aggregator_test

import (
	"testing"
	"time"
)

// BenchmarkStreamToClickHouse measures decisions/s from the stream into ClickHouse in one
// process: b.N decisions published beforehand in 512-decision messages (the publisher's
// batch), then consumed, inserted (with their rollups) and acked.
func BenchmarkStreamToClickHouse(b *testing.B) {
	e := newEnv(b)
	n := max(b.N, 1000)
	e.publish(n, 512)
	cfg := e.config("bench")
	cfg.BatchRows, cfg.FlushInterval = 50000, 200*time.Millisecond
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	e.startWith(cfg)
	for e.count("SELECT count() FROM %s.decisions") < uint64(n) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "decisions/s")
}
