package loadgen

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// errorSamples is how many distinct error messages a report keeps.
const errorSamples = 3

// stats are the counts of one phase (warm-up or measurement).
type stats struct {
	hist                     histogram // latency of answered checks, µs
	allowed, denied, errors  atomic.Uint64
	degraded, degradedDenied atomic.Uint64 // of the allowed and denied, a fail mode's answers

	mu      sync.Mutex
	samples []string // the first distinct error messages
}

// done counts the answers of one call, each of which took latency, and the checks that got
// none (failed), for err.
func (s *stats) done(a answers, failed int, err error, latency time.Duration) {
	allowed, denied := a.allowed, a.denied
	s.allowed.Add(uint64(allowed))
	s.denied.Add(uint64(denied))
	s.degraded.Add(uint64(a.degraded))
	s.degradedDenied.Add(uint64(a.degradedDenied))
	if err != nil {
		s.errors.Add(uint64(max(failed, 1)))
		msg := err.Error()
		s.mu.Lock()
		if len(s.samples) < errorSamples && !slices.Contains(s.samples, msg) {
			s.samples = append(s.samples, msg)
		}
		s.mu.Unlock()
	}
	s.hist.record(latency, uint64(allowed+denied))
}

// histogram is a log-linear latency histogram in the manner of HdrHistogram: values below 256µs
// are counted exactly, larger ones in buckets 1/128 of their power of two wide (under 0.8%
// error), up to about 19 hours. Recording is lock-free; quantiles may be read while recording.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Uint64 // µs
	max    atomic.Uint64 // µs
}

const (
	histSubBits = 8
	histHalf    = 1 << (histSubBits - 1)
	histMaxUS   = 1<<36 - 1
	histBuckets = (36-histSubBits)*histHalf + 1<<histSubBits
)

// histIndex is the bucket of v µs.
func histIndex(v uint64) int {
	if v < 1<<histSubBits {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits
	return shift*histHalf + int(v>>shift)
}

// histUpper is the largest value in bucket i.
func histUpper(i int) uint64 {
	if i < 1<<histSubBits {
		return uint64(i)
	}
	shift := i/histHalf - 1
	m := uint64(i - shift*histHalf)
	return (m+1)<<shift - 1
}

// record counts n values of d.
func (h *histogram) record(d time.Duration, n uint64) {
	if n == 0 {
		return
	}
	v := uint64(max(d.Microseconds(), 0))
	v = min(v, histMaxUS)
	h.counts[histIndex(v)].Add(n)
	h.total.Add(n)
	h.sum.Add(v * n)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// quantile returns the value at quantile q (0 < q <= 1) in µs: the largest value of the bucket
// holding the q·count-th smallest value, at most the largest recorded; 0 when empty.
func (h *histogram) quantile(q float64) uint64 {
	total := h.total.Load()
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = min(max(rank, 1), total)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return min(histUpper(i), h.max.Load())
		}
	}
	return h.max.Load() // counts still being added while we read
}

func (h *histogram) quantileMs(q float64) float64 { return float64(h.quantile(q)) / 1000 }

func (h *histogram) meanMs() float64 {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return round3(float64(h.sum.Load()) / float64(n) / 1000)
}
