package main

import (
	"flag"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// TestTourBenchStaysBelowTierProtection: the README's tour runs top to bottom against `make
// dev`, so its `quotaflow bench` runs must not trip the dev rules' tier protection — past the
// default tier's capacity every free limit is multiplied by the policy's factor, and the tour's
// next outputs (erin's 5 searches, the 44 of 50 left) no longer hold. It bounds the allowed
// checks of each run from its flags and the rules (an open loop sends at most rate ×
// duration; a closed loop is allowed at most, per subject, the tightest limit's burst plus its
// refill over the run) and compares their sum with the capacity.
func TestTourBenchStaysBelowTierProtection(t *testing.T) {
	t.Parallel()
	_, set, err := rules.LoadFile("../../deploy/dev/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tier := set.DefaultTier()
	var tp *rules.TierProtection
	for _, p := range set.Policies().TierProtection {
		if p.Tier == tier {
			tp = &p
		}
	}
	if tp == nil {
		t.Fatalf("the dev rules protect no %s tier: nothing to stay below", tier)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(readme), "\n## A 5-minute tour\n")
	if !ok {
		t.Fatal("README.md has no section \"A 5-minute tour\"")
	}
	tour, _, _ = strings.Cut(tour, "\n## ")
	var total int64
	runs := 0
	for line := range strings.Lines(tour) {
		cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "$ ./bin/quotaflow bench ")
		if !ok {
			continue
		}
		runs++
		n := benchAllowedBound(t, set, tier, strings.Fields(cmd))
		t.Logf("%s: at most %d allowed", cmd, n)
		total += n
	}
	if runs == 0 {
		t.Fatal("the tour has no `./bin/quotaflow bench` run")
	}
	if total > tp.Capacity {
		t.Errorf("the tour's bench runs may allow %d checks of tier %s, above its tier protection's capacity %d per %s: the tour's later steps would run on limits × %v",
			total, tier, tp.Capacity, tp.Window, tp.Factor)
	}
}

// benchAllowedBound bounds the checks a `quotaflow bench` run with args may have allowed.
func benchAllowedBound(t *testing.T, set *rules.Set, tier string, args []string) int64 {
	t.Helper()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	keys := fs.Int("keys", 10000, "")
	rate := fs.Float64("rate", 0, "")
	duration := fs.Duration("duration", 10*time.Second, "")
	warmup := fs.Duration("warmup", 0, "")
	endpoint := fs.String("endpoint", "/api/v1/orders", "")
	dimension := fs.String("dimension", "user", "")
	for _, name := range []string{"protocol", "distribution", "target", "key-prefix", "domain"} {
		fs.String(name, "", "")
	}
	fs.Int("concurrency", 64, "")
	fs.Bool("json", false, "")
	fs.Duration("timeout", 0, "")
	if err := fs.Parse(args); err != nil {
		t.Fatalf("bench %s: %v (a flag this test does not know: teach it)", strings.Join(args, " "), err)
	}
	run := *duration + *warmup
	if *rate > 0 {
		return int64(math.Ceil(*rate * run.Seconds()))
	}
	dim, err := rules.ParseDimension(*dimension)
	if err != nil {
		t.Fatal(err)
	}
	perSubject := int64(math.MaxInt64)
	for _, r := range set.Match(dim, tier, *endpoint) {
		if r.Shadow {
			continue
		}
		n := max(r.Burst, r.Limit) + int64(math.Ceil(float64(r.Limit)*run.Seconds()/r.Window.Seconds()))
		perSubject = min(perSubject, n)
	}
	if perSubject == math.MaxInt64 {
		t.Fatalf("no %s rule of tier %s limits %s: a closed loop is unbounded", dim, tier, *endpoint)
	}
	return int64(*keys) * perSubject
}
