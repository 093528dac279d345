package main

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// keyPicker draws subject numbers in [0, n) from a distribution. It is not safe for concurrent
// use: each worker has its own.
type keyPicker struct {
	n    int
	r    *rand.Rand
	zipf *rand.Zipf // zipf only
	hot  int        // hot only: the number of hot subjects
}

// The zipf and hot distributions' parameters.
const (
	zipfS       = 1.1
	hotShare    = 0.9  // of checks...
	hotFraction = 0.01 // ...go to this share of the subjects
)

func newKeyPicker(distribution string, n int, seed uint64) (*keyPicker, error) {
	p := &keyPicker{n: n, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	switch distribution {
	case "uniform":
	case "zipf":
		p.zipf = rand.NewZipf(p.r, zipfS, 1, uint64(n-1))
	case "hot":
		p.hot = max(1, int(float64(n)*hotFraction))
	default:
		return nil, fmt.Errorf("--distribution: want uniform, zipf or hot, got %q", distribution)
	}
	return p, nil
}

// next returns a subject number. uniform: every subject alike; zipf: subject k with probability
// proportional to 1/(k+1)^1.1; hot: 90% of draws among the first 1% of subjects (at least one),
// the other 10% uniform over all of them.
func (p *keyPicker) next() int {
	switch {
	case p.zipf != nil:
		return int(p.zipf.Uint64())
	case p.hot > 0 && p.r.Float64() < hotShare:
		return p.r.IntN(p.hot)
	}
	return p.r.IntN(p.n)
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

func (h *histogram) record(d time.Duration) {
	v := uint64(max(d.Microseconds(), 0))
	v = min(v, histMaxUS)
	h.counts[histIndex(v)].Add(1)
	h.total.Add(1)
	h.sum.Add(v)
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
