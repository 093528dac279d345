package loadgen

import (
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	t.Parallel()
	// Buckets tile the values: each value is in the bucket whose range holds it, and buckets are
	// at most 1/128 of their values wide.
	for v := uint64(0); v < 1<<22; v += 1 + v/97 {
		i := histIndex(v)
		if up := histUpper(i); up < v || (i > 0 && histUpper(i-1) >= v) {
			t.Fatalf("value %d in bucket %d [%d, %d]", v, i, histUpper(i-1)+1, up)
		}
		if lo := histUpper(i-1) + 1; v >= 256 && float64(histUpper(i)-lo+1) > float64(lo)/128 {
			t.Fatalf("bucket %d [%d, %d] too wide", i, lo, histUpper(i))
		}
	}
	if i := histIndex(histMaxUS); i != histBuckets-1 {
		t.Fatalf("histIndex(max) = %d, want the last bucket %d", i, histBuckets-1)
	}

	var h histogram
	if h.quantile(0.99) != 0 || h.meanMs() != 0 {
		t.Error("empty histogram: want zeros")
	}
	for v := 1; v <= 100; v++ { // exact below 256µs
		h.record(time.Duration(v)*time.Microsecond, 1)
	}
	for q, want := range map[float64]uint64{0.01: 1, 0.5: 50, 0.9: 90, 0.99: 99, 0.999: 100, 1: 100} {
		if got := h.quantile(q); got != want {
			t.Errorf("1..100µs: quantile(%v) = %d, want %d", q, got, want)
		}
	}
	if h.meanMs() != 0.051 { // 50.5µs, rounded to the µs
		t.Errorf("mean %vms, want 0.051", h.meanMs())
	}

	var u histogram
	for v := 1; v <= 100000; v++ {
		u.record(time.Duration(v)*time.Microsecond, 1)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		want := q * 100000
		if got := float64(u.quantile(q)); got < want || got > want*1.01 {
			t.Errorf("1..100000µs: quantile(%v) = %v, want %v within +1%%", q, got, want)
		}
	}
	if u.quantile(1) != 100000 || u.quantileMs(1) != 100 {
		t.Errorf("quantile(1) = %d, want the maximum 100000", u.quantile(1))
	}
	var big histogram
	big.record(-time.Second, 1)  // clamped to 0
	big.record(100*time.Hour, 1) // clamped to the largest value
	if big.quantile(0.5) != 0 || big.quantile(1) != histMaxUS {
		t.Errorf("clamping: quantiles %d, %d", big.quantile(0.5), big.quantile(1))
	}
}
