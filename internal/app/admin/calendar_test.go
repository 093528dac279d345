package admin

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

const calendarAdminRules = `
default_tier: free
tiers: {free: {}, emea: {timezone: Europe/Berlin}}
rules:
  - {id: monthly, dimension: user, endpoint: /monthly, algorithm: fixed_window, limit: 100, window: 1mo, timezone: Asia/Tokyo}
`

// TestCalendarUserZone: PUT /users/{id}/timezone gives a user its own time zone and anchor day,
// which its limits view shows and its checks reset by; bad ones are refused by field; an empty
// zone gives the rule's back.
func TestCalendarUserZone(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, calendarAdminRules, Config{})
	user := id(t, "zoned")
	for _, tt := range []struct{ body, field string }{
		{`{"timezone":"Mars/Olympus_Mons"}`, "timezone"},
		{`{"timezone":"Local"}`, "timezone"},
		{`{"timezone":"UTC","anchor_day":32}`, "anchor_day"},
	} {
		if got := env.call(t, "PUT", "/api/v1/users/"+user+"/timezone", writeToken, tt.body); got.status != 400 || got.body["field"] != tt.field {
			t.Errorf("PUT %s = %d %s, want 400 naming %s", tt.body, got.status, got.raw, tt.field)
		}
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/timezone", readToken, `{"timezone":"UTC"}`); got.status != 403 {
		t.Errorf("PUT with a read token = %d, want 403", got.status)
	}

	limits := func() userLimit {
		t.Helper()
		got := env.call(t, "GET", "/api/v1/users/"+user+"/limits", readToken, nil)
		var body userLimits
		if err := json.Unmarshal([]byte(got.raw), &body); err != nil || len(body.Limits) != 1 {
			t.Fatalf("GET limits = %d %s", got.status, got.raw)
		}
		return body.Limits[0]
	}
	if l := limits(); l.Window != "1mo" || l.Timezone != "Asia/Tokyo" || l.AnchorDay != 0 {
		t.Errorf("before: window %q, zone %q, anchor %d; want 1mo in Asia/Tokyo", l.Window, l.Timezone, l.AnchorDay)
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/timezone", writeToken, `{"timezone":"America/New_York","anchor_day":15}`); got.status != 200 {
		t.Fatalf("PUT zone = %d %s", got.status, got.raw)
	}
	ny, _ := time.LoadLocation("America/New_York")
	wantReset := calendar.Period{Unit: calendar.Month, Location: ny, AnchorDay: 15}.Next(time.Now())
	poll.Until(t, 5*time.Second, "the user's zone is enforced", poll.True(func() bool {
		l := limits()
		return l.Timezone == "America/New_York" && l.AnchorDay == 15
	}))
	env.check(t, user, "/monthly")
	if l := limits(); l.ResetAt == nil || !l.ResetAt.Equal(wantReset) || l.Used == nil || *l.Used != 1 {
		t.Errorf("after a check: used %v, reset %v; want 1 used, reset at %s (the 15th in New York)", l.Used, l.ResetAt, wantReset)
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/timezone", writeToken, `{"timezone":""}`); got.status != 200 {
		t.Fatalf("PUT empty zone = %d %s", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the rule's zone is back", poll.True(func() bool { return limits().Timezone == "Asia/Tokyo" }))
}
