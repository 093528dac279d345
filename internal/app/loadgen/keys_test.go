package loadgen

import "testing"

func TestKeyPickers(t *testing.T) {
	t.Parallel()
	const n, draws = 10000, 200000
	counts := func(dist Distribution) []int {
		p, err := newKeyPicker(dist, n, 42)
		if err != nil {
			t.Fatal(err)
		}
		c := make([]int, n)
		for range draws {
			k := p.next()
			if k < 0 || k >= n {
				t.Fatalf("%s: key %d out of [0, %d)", dist, k, n)
			}
			c[k]++
		}
		return c
	}
	share := func(c []int, lo, hi int) float64 {
		s := 0
		for _, x := range c[lo:hi] {
			s += x
		}
		return float64(s) / draws
	}
	uni := counts("uniform")
	if s := share(uni, 0, n/100); s < 0.008 || s > 0.012 {
		t.Errorf("uniform: first 1%% of keys got %.3f of the draws, want about 0.01", s)
	}
	// Zipf s=1.1 over 10k keys: key 0 gets about 15%, the first 1% of keys about 65%.
	z := counts("zipf")
	if s := share(z, 0, 1); s < 0.12 || s > 0.18 {
		t.Errorf("zipf: key 0 got %.3f of the draws, want about 0.15", s)
	}
	if s := share(z, 0, n/100); s < 0.6 || s > 0.7 {
		t.Errorf("zipf: first 1%% of keys got %.3f, want about 0.65", s)
	}
	if !(z[0] > z[1] && z[1] > z[10] && z[10] > z[1000]) {
		t.Errorf("zipf: counts %d, %d, %d, %d not decreasing", z[0], z[1], z[10], z[1000])
	}
	hot := counts("hot")
	if s := share(hot, 0, n/100); s < 0.89 || s > 0.91 {
		t.Errorf("hot: first 1%% of keys got %.3f, want about 0.901", s)
	}
	if s := share(hot, n/100, n); s < 0.09 || s > 0.11 {
		t.Errorf("hot: other keys got %.3f, want about 0.099", s)
	}
	for _, dist := range []Distribution{DistributionUniform, DistributionZipf, DistributionHot} {
		p, _ := newKeyPicker(dist, 1, 1)
		for range 100 {
			if k := p.next(); k != 0 {
				t.Fatalf("%s over one key: got %d", dist, k)
			}
		}
	}
}
