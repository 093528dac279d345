package checker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// orgRules: the members of an org share 60 units a day, each at most 30; keys of the org count
// against it when their user has none.
func orgRules(t *testing.T, org string) *rules.Set {
	return mustRules(t, `
default_tier: free
tiers: {free: {}}
users:
  `+org+`-a: {org: `+org+`}
  `+org+`-b: {org: `+org+`}
  `+org+`-c: {org: `+org+`}
  loner: {}
api_keys:
  `+org+`-key: {org: `+org+`}
rules:
  - {id: org-day, dimension: org, endpoint: /llm, algorithm: fixed_window, limit: 60, window: 24h}
  - {id: member-day, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 30, window: 24h}
`)
}

// TestOrgBudget: a check charges its user's own limits and its org's shared one, all or
// nothing; the answer names the level that denied. One member cannot take another's cap, but
// members together exhaust the org's budget; an API key of the org counts against it too; a
// check cannot name an org.
func TestOrgBudget(t *testing.T) {
	t.Parallel()
	org := checkertest.ID(t, "acme")
	e := newEngine(t, Config{Rules: orgRules(t, org), DisableOverLimitCache: true})
	ctx := context.Background()
	check := func(user string, cost int64) *Outcome {
		t.Helper()
		out, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// a takes its whole cap, and no more: the member rule denies.
	if out := check(org+"-a", 30); !out.Allowed {
		t.Fatalf("a's 30: denied, want allowed")
	}
	out := check(org+"-a", 1)
	if d := out.DecidingLimit(); out.Allowed || d.Rule.ID != "member-day" || d.Subject.Dimension != rules.DimensionUser {
		t.Fatalf("a's 31st: allowed %v by %s (%s), want denied by member-day", out.Allowed, d.Rule.ID, d.Subject.Dimension)
	}
	// b still has its own cap, and the org 30 left: b takes 25.
	if out := check(org+"-b", 25); !out.Allowed {
		t.Fatalf("b's 25: denied, want allowed (its cap is its own)")
	}
	// c asks for 10: within its cap, past the org's 5 left. Denied by the org, and c's own
	// bucket is not charged.
	out = check(org+"-c", 10)
	if d := out.DecidingLimit(); out.Allowed || d.Rule.ID != "org-day" || d.Subject.Dimension != rules.DimensionOrg || d.Subject.ID != org {
		t.Fatalf("c's 10: allowed %v by %s (%s %s), want denied by org-day of %s", out.Allowed, d.Rule.ID, d.Subject.Dimension, d.Subject.ID, org)
	}
	for _, l := range out.Limits {
		if l.Rule.ID == "member-day" && l.Result.Used != 0 {
			t.Errorf("c's member bucket after the org denied: used %d, want 0 (all or nothing)", l.Result.Used)
		}
	}
	// The org's key counts against it: 5 left, then none.
	keyCheck := func(cost int64) *Outcome {
		out, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionAPIKey, ID: org + "-key"}}, Endpoint: "/llm", Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if !keyCheck(5).Allowed || keyCheck(1).Allowed {
		t.Errorf("the org's key: want its last 5 allowed, then denied")
	}
	// A user of no org is not counted against any.
	if out := check(checkertest.ID(t, "loner"), 30); !out.Allowed || len(out.Limits) != 1 {
		t.Errorf("loner: allowed %v with %d limits, want allowed by its own rule alone", out.Allowed, len(out.Limits))
	}
	_, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionOrg, ID: org}}, Endpoint: "/llm"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "subjects[0].dimension" {
		t.Errorf("a check naming an org: %v, want a FieldError naming subjects[0].dimension", err)
	}
}

// TestOrgBudgetExact: concurrent checks of three members never admit more than the org's
// budget, nor a member past its own cap, whichever slots (cluster masters) the org and the
// members live in; and no charge leaks: once the refunds of the checks one level denied are in,
// what the org has left is its budget less what was admitted, to the unit. (Concurrent checks
// may admit less: a check denied by its member's cap holds its org charge until its refund, and
// denies others meanwhile; the checks after them get those units back.)
func TestOrgBudgetExact(t *testing.T) {
	t.Parallel()
	org := checkertest.ID(t, "exact")
	e := newEngine(t, Config{Rules: orgRules(t, org), DisableOverLimitCache: true})
	var total atomic.Int64
	per := map[string]*atomic.Int64{}
	var wg sync.WaitGroup
	for _, m := range []string{"a", "b", "c"} {
		user := org + "-" + m
		per[user] = new(atomic.Int64)
		for range 50 {
			wg.Go(func() {
				out, err := e.Check(context.Background(), &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if out.Allowed {
					total.Add(1)
					per[user].Add(1)
				}
			})
		}
	}
	wg.Wait()
	if got := total.Load(); got > 60 {
		t.Errorf("150 concurrent checks against an org budget of 60: %d allowed, want at most 60", got)
	}
	for user, n := range per {
		if n.Load() > 30 {
			t.Errorf("%s: %d allowed, past its cap of 30", user, n.Load())
		}
	}
	// One at a time, the members take what is left: exactly 60 in all.
	for progress := true; progress; {
		progress = false
		for user, n := range per {
			out, err := e.Check(context.Background(), &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if out.Allowed {
				total.Add(1)
				n.Add(1)
				progress = true
			}
		}
	}
	if got := total.Load(); got != 60 {
		t.Errorf("after the concurrent checks' refunds, the members took %d in all, want exactly the budget of 60", got)
	}
}
