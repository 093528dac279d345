package loadgen

import (
	"fmt"
	"math/rand/v2"
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

func newKeyPicker(d Distribution, n int, seed uint64) (*keyPicker, error) {
	p := &keyPicker{n: n, r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	switch d {
	case DistributionUniform:
	case DistributionZipf:
		p.zipf = rand.NewZipf(p.r, zipfS, 1, uint64(n-1))
	case DistributionHot:
		p.hot = max(1, int(float64(n)*hotFraction))
	default:
		return nil, fmt.Errorf("distribution: want uniform, zipf or hot, got %q", d)
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
