package checker

import (
	"context"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

const calendarRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: monthly, dimension: user, endpoint: /monthly, algorithm: fixed_window, limit: 3, window: 1mo, timezone: Europe/Berlin}
`

// TestCalendarSkewedCheckers: a monthly quota in Europe/Berlin resets at local midnight on the
// 1st by Redis's clock, whatever the checkers' clocks say. The scripts are moved to the
// minutes around the next month's start (bucket.StoreConfig.ClockOffset); the checkers' own
// clocks are minutes off, either way (Config.clock). A checker that still thinks it is the old
// month counts a check made just after midnight in the new one, and answers the new month's
// real end (31 or 30 days, DST or not) as the reset.
func TestCalendarSkewedCheckers(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	month := calendar.Period{Unit: calendar.Month, Location: berlin}
	start := month.Next(time.Now()) // the next 1st, 00:00 in Berlin
	// engine returns an engine whose checks Redis decides at start+redisAt and whose own clock
	// reads start+clockAt.
	engine := func(redisAt, clockAt time.Duration) *Engine {
		rdb := redisSrv.UniversalClient()
		t.Cleanup(func() { rdb.Close() })
		store := bucket.NewStoreWithConfig(rdb, bucket.StoreConfig{ClockOffset: time.Until(start.Add(redisAt))})
		t.Cleanup(func() { store.Close() })
		shift := time.Until(start.Add(clockAt))
		return newEngine(t, Config{Redis: rdb, store: store, Rules: checkertest.Rules(t, calendarRules), DisableOverLimitCache: true,
			clock: func() time.Time { return time.Now().Add(shift) }})
	}
	user := checkertest.ID(t, "cal")
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/monthly", Cost: 1}
	ctx := context.Background()
	decide := func(e *Engine) *LimitOutcome {
		t.Helper()
		out, err := e.Check(ctx, q)
		if err != nil || len(out.Limits) != 1 {
			t.Fatalf("Check: %v, %v", out, err)
		}
		return &out.Limits[0]
	}

	// The old month's last minutes, on a checker whose clock is right: the quota runs out, to
	// be reset at the 1st's midnight.
	old := engine(-10*time.Minute, -10*time.Minute)
	for i := range 4 {
		l := decide(old)
		if want := i < 3; l.Result.Allowed != want || !l.Result.ResetAt.Equal(start) {
			t.Fatalf("old month, check %d: allowed %v, reset %s; want %v, reset at %s", i, l.Result.Allowed, l.Result.ResetAt, want, start)
		}
	}
	end := month.Next(start)
	for _, tt := range []struct {
		name    string
		clockAt time.Duration
		used    int64
	}{
		{"a checker 5 minutes behind (still in the old month)", -5 * time.Minute, 1},
		{"a checker 7 minutes ahead", 7 * time.Minute, 2},
		{"a checker 3 hours behind", -3 * time.Hour, 3},
	} {
		l := decide(engine(30*time.Second, tt.clockAt))
		if !l.Result.Allowed || l.Result.Used != tt.used || !l.Result.ResetAt.Equal(end) {
			t.Errorf("%s, 30s into the new month: allowed %v, used %d, reset %s; want allowed, used %d, reset at %s",
				tt.name, l.Result.Allowed, l.Result.Used, l.Result.ResetAt, tt.used, end)
		}
	}
	if l := decide(engine(time.Minute, 0)); l.Result.Allowed || l.Result.RetryAfter < end.Sub(start)-2*time.Minute {
		t.Errorf("4th check of the new month: allowed %v, retry after %s; want denied until the month's end", l.Result.Allowed, l.Result.RetryAfter)
	}
}
