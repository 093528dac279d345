package rulestore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// BenchmarkPutOverride puts overrides into a store already holding 1,000: what a penalty policy
// does for each throttled subject. Its cost must not grow with the overrides in force.
func BenchmarkPutOverride(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	if _, err := s.Seed(ctx, mustDecode(b, doc)); err != nil {
		b.Fatal(err)
	}
	put := func(i int) {
		now := time.Now()
		o := rules.Override{ID: fmt.Sprintf("bench-%d", i), Dimension: "user", Identifier: fmt.Sprintf("u%d", i), Multiplier: 0.5,
			Reason: "bench", Creator: "bench", Source: "penalty", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s.PutOverride(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 1000 {
		put(-1 - i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		put(i)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/put")
}
