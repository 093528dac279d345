package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

const calendarDoc = `
default_tier: free
tiers:
  free: {}
  emea: {timezone: Europe/Berlin}
users:
  ny: {timezone: America/New_York, anchor_day: 15}
  billed: {tier: emea, anchor_day: 28}
rules:
  - {id: monthly, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 10000, window: 1mo, timezone: Asia/Tokyo, anchor_day: 3}
  - {id: daily, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 500, window: 1d}
  - {id: weekly, dimension: apikey, endpoint: /api/*, algorithm: fixed_window, limit: 900, window: 1w, timezone: Europe/London}
  - {id: yearly, dimension: global, endpoint: /api/*, algorithm: fixed_window, limit: 1000000, window: 1y}
`

// TestCalendarRules: calendar windows parse into a period in the rule's zone, whose limits are
// calendar windows over the periods around now in the subject's zone: the user's, else its
// tier's, else the rule's.
func TestCalendarRules(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(calendarDoc))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(id string) *Rule {
		r, ok := s.Rule(id)
		if !ok {
			t.Fatalf("no rule %q", id)
		}
		return r
	}
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	berlin, _ := time.LoadLocation("Europe/Berlin")
	ny, _ := time.LoadLocation("America/New_York")
	monthly := rule("monthly")
	if c := monthly.Calendar; c.Unit != calendar.Month || c.Location.String() != "Asia/Tokyo" || c.AnchorDay != 3 ||
		monthly.Window != 30*24*time.Hour || monthly.WindowName() != "1mo" {
		t.Fatalf("monthly: calendar %+v, window %s (%s); want months from the 3rd in Tokyo, nominally 30 days", c, monthly.Window, monthly.WindowName())
	}
	if c := rule("daily").Calendar; c.Unit != calendar.Day || c.Location != time.UTC {
		t.Errorf("daily: %+v, want days in UTC", c)
	}
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name, user, tier string
		want             calendar.Period
	}{
		{"the rule's zone", "someone", "free", calendar.Period{Unit: calendar.Month, Location: tokyo, AnchorDay: 3}},
		{"the tier's zone", "someone", "emea", calendar.Period{Unit: calendar.Month, Location: berlin, AnchorDay: 3}},
		{"the user's zone and anchor", "ny", "free", calendar.Period{Unit: calendar.Month, Location: ny, AnchorDay: 15}},
		{"the user's anchor in its tier's zone", "billed", "emea", calendar.Period{Unit: calendar.Month, Location: berlin, AnchorDay: 28}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Period(monthly, DimensionUser, tt.user, tt.tier); !samePeriod(got, tt.want) {
				t.Errorf("Period = %+v, want %+v", got, tt.want)
			}
			if limit, _ := s.Effective(monthly, DimensionUser, tt.user, tt.tier, 0, now); limit != 10000 {
				t.Errorf("Effective = %d, want 10000", limit)
			}
		})
	}
	// A tier's anchor day is for monthly rules only: a daily rule keeps its days.
	if p := s.Period(rule("daily"), DimensionUser, "billed", "emea"); p.AnchorDay != 0 || p.Location.String() != berlin.String() {
		t.Errorf("daily rule for billed: %+v, want days in Berlin, no anchor", p)
	}
}

// samePeriod compares periods by their zones' names: each load of a zone is its own *Location.
func samePeriod(a, b calendar.Period) bool {
	return a.Unit == b.Unit && a.AnchorDay == b.AnchorDay && a.Location.String() == b.Location.String()
}

func TestCalendarRuleErrors(t *testing.T) {
	t.Parallel()
	const rule = "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, "
	tests := []struct {
		name, doc string
		want      string
	}{
		{"calendar token bucket", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: token_bucket, limit: 5, window: 1mo}",
			`rule "a" (rules[0]): window: 1mo is a calendar window, which only fixed_window counts; algorithm is token_bucket`},
		{"unknown zone", rule + "window: 1d, timezone: Mars/Olympus}", `rule "a" (rules[0]): timezone: unknown time zone "Mars/Olympus"`},
		{"the host's zone", rule + "window: 1d, timezone: Local}", `timezone: unknown time zone "Local"`},
		{"anchor on a week", rule + "window: 1w, anchor_day: 31}", `rule "a" (rules[0]): anchor_day: only monthly windows (1mo) have one; window is 1w`},
		{"anchor out of range", rule + "window: 1mo, anchor_day: 32}", `anchor_day: want a day of the month from 1 to 31, got "32"`},
		{"anchor zero", rule + "window: 1mo, anchor_day: 0}", `anchor_day: want a day of the month from 1 to 31, got "0"`},
		{"zone on a duration", rule + "window: 24h, timezone: UTC}", `timezone: only calendar windows (1d, 1w, 1mo, 1y) have one; window is "24h"`},
		{"anchor on a duration", rule + "window: 720h, anchor_day: 3}", `anchor_day: only monthly windows (1mo) have one; window is "720h"`},
		{"leased calendar", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 500, window: 1d, lease: {slice: 10}}",
			`lease: calendar windows (1d) are not leased`},
		{"tier zone", "default_tier: t\ntiers: {t: {timezone: Nowhere}}\n" + rule + "window: 1d}", `tiers["t"]: timezone: unknown time zone "Nowhere"`},
		{"user anchor", "users: {u: {anchor_day: 40}}\n" + rule + "window: 1mo}", `users["u"]: anchor_day: want a day of the month from 1 to 31, got "40"`},
		{"concurrency fail mode local", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: concurrency, limit: 5, window: 1m, fail_mode: local}",
			`fail_mode: local cannot count requests in flight (releases go to Redis); want open or closed`},
		{"concurrency held for days", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: concurrency, limit: 5, window: 48h}",
			`window: a concurrency rule's window is how long a place is held unless released, at most 24h0m0s; got 48h0m0s`},
		{"concurrency with a burst", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: concurrency, limit: 5, window: 1m, burst: 9}",
			`burst: concurrency counts up to its limit`},
		{"calendar_window by name", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: calendar_window, limit: 5, window: 1mo}", `algorithm: unknown algorithm "calendar_window"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse: %v\nwant an error containing %s", err, tt.want)
			}
		})
	}
}

// TestCalendarKeepsDurations: a window of 24h is a duration, not a day: its rule has no
// calendar, and a calendar rule of the same endpoint is another bucket.
func TestCalendarKeepsDurations(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte("rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 24h}\n" +
		"- {id: b, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1d}"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Rule("a")
	if a.Calendar.Unit.Valid() || a.Algorithm != algorithm.FixedWindow {
		t.Errorf("24h: %+v, want a plain fixed window", a)
	}
}
