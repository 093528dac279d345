package checker

import (
	"context"
	"testing"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestAnswerStateFollowsRuleThresholds: an answer's warning state uses the rule's own warning
// threshold, as the aggregator's events do (rules.Thresholds.Enters: used above enter × limit),
// so that an answer never says warning while the event stream says normal, or the reverse, on
// the way up.
func TestAnswerStateFollowsRuleThresholds(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, `
rules:
  - {id: default-th, dimension: user, endpoint: /default, algorithm: fixed_window, limit: 10, window: 1h}
  - {id: high-th, dimension: user, endpoint: /high, algorithm: fixed_window, limit: 10, window: 1h, warning: {enter: 0.9, exit: 0.5}}
  - {id: bursty, dimension: user, endpoint: /bursty, algorithm: token_bucket, limit: 10, window: 1h, burst: 20, warning: {enter: 0.9}}
  - {id: monthly, dimension: user, endpoint: /monthly, algorithm: fixed_window, limit: 10, window: 1mo, timezone: Europe/Berlin}
`)})
	const (
		normal    = StateNormal
		warning   = StateWarning
		throttled = StateThrottled
	)
	tests := []struct {
		endpoint string
		checks   int
		want     map[int]State // the state of the answer to the nth check
	}{
		// The default enter is 0.8: warning once more than 8 of 10 are used.
		{"/default", 11, map[int]State{1: normal, 8: normal, 9: warning, 10: warning, 11: throttled}},
		// enter 0.9: 9 of 10 used is not past it (the checker's former fixed 0.8 said warning).
		{"/high", 11, map[int]State{8: normal, 9: normal, 10: warning, 11: throttled}},
		// The ratio is to the limit per window, not the burst, as in the events: 9 used is not
		// past 0.9 × 10, 10 is, with 10 more of burst left.
		{"/bursty", 10, map[int]State{9: normal, 10: warning}},
		// A monthly calendar quota warns like any other: past 80 % of the month's.
		{"/monthly", 11, map[int]State{8: normal, 9: warning, 11: throttled}},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint, func(t *testing.T) {
			t.Parallel()
			user := checkertest.ID(t, "u")
			for n := 1; n <= tt.checks; n++ {
				out, err := e.Check(context.Background(), userQuery(user, tt.endpoint))
				if err != nil {
					t.Fatal(err)
				}
				want, ok := tt.want[n]
				if !ok {
					continue
				}
				if got := out.State(); got != want {
					t.Errorf("check %d: state %v, want %v (used %d)", n, got, want, out.DecidingLimit().Result.Used)
				}
				if got := out.Limits[0].State(); got != want {
					t.Errorf("check %d: limit state %v, want %v", n, got, want)
				}
			}
		})
	}
}
