package admin

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

const orgAdminRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: org-day, dimension: org, endpoint: /llm, algorithm: fixed_window, limit: 50, window: 24h}
  - {id: member-day, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 20, window: 24h}
`

// TestUserOrg: PUT /users/{id}/org makes the user a member of an org, whose org rules then count
// its checks and appear in its limits view, with the org named; a bad org is refused by field.
func TestUserOrg(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, orgAdminRules, Config{})
	user, org := id(t, "member"), id(t, "acme")
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'x'
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/org", writeToken, `{"org":"`+string(long)+`"}`); got.status != 400 || got.body["field"] != "org" {
		t.Errorf("PUT a 300-byte org = %d %s, want 400 naming org", got.status, got.raw)
	}
	limits := func() userLimits {
		t.Helper()
		got := env.call(t, "GET", "/api/v1/users/"+user+"/limits", readToken, nil)
		var body userLimits
		if err := json.Unmarshal([]byte(got.raw), &body); err != nil {
			t.Fatalf("GET limits = %d %s", got.status, got.raw)
		}
		return body
	}
	if l := limits(); l.Org != "" || len(l.Limits) != 1 {
		t.Fatalf("before: org %q, %d limits; want none and the member rule", l.Org, len(l.Limits))
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/org", writeToken, `{"org":"`+org+`"}`); got.status != 200 {
		t.Fatalf("PUT org = %d %s", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the org is enforced", poll.True(func() bool { return limits().Org == org }))
	env.check(t, user, "/llm")
	l := limits()
	if len(l.Limits) != 2 || l.Limits[1].RuleID != "org-day" || l.Limits[1].Dimension != "org" ||
		l.Limits[1].Used == nil || *l.Limits[1].Used != 1 || l.Limits[0].Dimension != "user" {
		t.Errorf("after a check: %+v; want member-day (user) then org-day (org) with 1 used", l.Limits)
	}
}
