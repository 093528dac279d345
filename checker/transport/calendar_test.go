package transport

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/calendar"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const calendarTransportRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: daily, dimension: user, endpoint: /daily, algorithm: fixed_window, limit: 2, window: 1d, timezone: Pacific/Chatham}
  - {id: weekly, dimension: user, endpoint: /weekly, algorithm: fixed_window, limit: 5, window: 1w, timezone: America/Los_Angeles}
  - {id: monthly, dimension: user, endpoint: /monthly, algorithm: fixed_window, limit: 9, window: 1mo, timezone: Asia/Kathmandu, anchor_day: 31}
  - {id: yearly, dimension: user, endpoint: /yearly, algorithm: fixed_window, limit: 9, window: 1y}
`

// TestCalendarOverTransports: a calendar quota's answer gives the real end of its period in the
// rule's zone: reset_at over Connect, duration_until_reset and Envoy's unit over RLS, and a
// denial's retry_after and Retry-After count down to it.
func TestCalendarOverTransports(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{Rules: mustRules(t, calendarTransportRules)})
	zone := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	tests := []struct {
		endpoint string
		period   calendar.Period
		unit     ratelimitv3.RateLimitResponse_RateLimit_Unit
		limit    int
	}{
		{"/daily", calendar.Period{Unit: calendar.Day, Location: zone("Pacific/Chatham")}, ratelimitv3.RateLimitResponse_RateLimit_DAY, 2},
		{"/weekly", calendar.Period{Unit: calendar.Week, Location: zone("America/Los_Angeles")}, ratelimitv3.RateLimitResponse_RateLimit_WEEK, 5},
		{"/monthly", calendar.Period{Unit: calendar.Month, Location: zone("Asia/Kathmandu"), AnchorDay: 31}, ratelimitv3.RateLimitResponse_RateLimit_MONTH, 9},
		{"/yearly", calendar.Period{Unit: calendar.Year}, ratelimitv3.RateLimitResponse_RateLimit_YEAR, 9},
	}
	for _, tt := range tests {
		t.Run(tt.endpoint, func(t *testing.T) {
			t.Parallel()
			user := id(t, "cal")
			resp := e.should(t, rlsReq(desc("user_id", user, "path", tt.endpoint)))
			end := tt.period.Next(time.Now())
			st := resp.Statuses[0]
			if st.CurrentLimit.GetUnit() != tt.unit || st.CurrentLimit.GetRequestsPerUnit() != uint32(tt.limit) || st.CurrentLimit.GetUnitMultiplier() != nil {
				t.Errorf("current_limit %v, want %d per %s", st.CurrentLimit, tt.limit, tt.unit)
			}
			if d := time.Until(end) - st.DurationUntilReset.AsDuration(); d < -2*time.Second || d > 2*time.Second {
				t.Errorf("duration_until_reset %s, want the time until %s (%s)", st.DurationUntilReset.AsDuration(), end, time.Until(end))
			}
			var last *quotaflowv1.CheckRateLimitResponse
			for range tt.limit {
				r, err := e.testEnv.client("connect").CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
					Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: tt.endpoint}))
				if err != nil {
					t.Fatal(err)
				}
				last = r.Msg
			}
			if last.Allowed || last.ResetAt != end.Unix() {
				t.Errorf("check past the limit: allowed %v, reset_at %d; want denied, reset at %d (%s)", last.Allowed, last.ResetAt, end.Unix(), end)
			}
			if d := time.Until(end) - time.Duration(last.RetryAfterMs)*time.Millisecond; d < -2*time.Second || d > 2*time.Second {
				t.Errorf("retry_after %dms, want the time until %s", last.RetryAfterMs, end)
			}
		})
	}
}
