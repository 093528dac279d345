package checker

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// TestBucketLimit: the planner compiles each rule into the bucket limit the store enforces:
// the user's custom limit (its burst following it where the file left it to default), the
// rule's delay and overage bound, a bucket no one caller owns pooled, and a calendar rule a
// calendar window over the subject's periods around now.
func TestBucketLimit(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse([]byte(`
rules:
  - {id: tb, dimension: user, endpoint: /x, algorithm: token_bucket, limit: 10, window: 1s}
  - {id: burst, dimension: apikey, endpoint: /x, algorithm: token_bucket, limit: 10, burst: 3, window: 1s}
  - {id: fw, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 10, window: 1s}
  - {id: pooled, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 10, window: 1s, max_overage: 4}
  - {id: queue, dimension: user, endpoint: /x, algorithm: gcra, limit: 10, window: 1s, on_limit: delay, max_delay: 500ms}
  - {id: monthly, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 10000, window: 1mo, timezone: Asia/Tokyo, anchor_day: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(id string) *rules.Rule {
		r, ok := set.Rule(id)
		if !ok {
			t.Fatalf("no rule %s", id)
		}
		return r
	}
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	user := Subject{Dimension: rules.DimensionUser, ID: "u"}
	tests := []struct {
		name   string
		rule   string
		sub    Subject
		custom int64
		want   bucket.Limit
	}{
		{"no custom limit", "tb", user, 0,
			bucket.Limit{Key: "k", Algorithm: algorithm.TokenBucket, Limit: 10, Burst: 10, Window: time.Second}},
		{"default burst follows the limit", "tb", user, 50,
			bucket.Limit{Key: "k", Algorithm: algorithm.TokenBucket, Limit: 50, Burst: 50, Window: time.Second}},
		{"explicit burst is kept", "burst", Subject{Dimension: rules.DimensionAPIKey, ID: "k"}, 50,
			bucket.Limit{Key: "k", Algorithm: algorithm.TokenBucket, Limit: 50, Burst: 3, Window: time.Second}},
		{"window algorithm", "fw", user, 7,
			bucket.Limit{Key: "k", Algorithm: algorithm.FixedWindow, Limit: 7, Burst: 7, Window: time.Second}},
		{"a shared bucket, its overage bounded", "pooled", globalSubject, 0,
			bucket.Limit{Key: "k", Algorithm: algorithm.FixedWindow, Limit: 10, Burst: 10, Window: time.Second, OverageCap: 4, Pooled: true}},
		{"a delay", "queue", user, 0,
			bucket.Limit{Key: "k", Algorithm: algorithm.GCRA, Limit: 10, Burst: 10, Window: time.Second, MaxDelay: 500 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := bucketLimit(set, rule(tt.rule), "k", tt.sub, "", tt.custom, now); got != tt.want {
				t.Errorf("bucketLimit = %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("calendar", func(t *testing.T) {
		t.Parallel()
		r := rule("monthly")
		got := bucketLimit(set, r, "k", user, "", 0, now)
		want := set.Period(r, user.Dimension, user.ID, "").Around(now)
		if got.Algorithm != algorithm.CalendarWindow || !got.Periods.Start.Equal(want.Start) ||
			got.Periods.First != want.First || got.Periods.Second != want.Second || got.Limit != 10000 {
			t.Errorf("bucketLimit = %+v, want a calendar window of 10000 over %+v", got, want)
		}
	})
}
