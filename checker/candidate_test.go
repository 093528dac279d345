package checker

import (
	"context"
	"strconv"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// candidateRules give a user a live limit of 3 with two candidates, one raising it to 5 and
// one a GCRA of 2, and count each IP address too.
const candidateRules = `
rules:
  - {id: live, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: raise, candidate_of: live, limit: 5}
  - {id: lower, candidate_of: live, algorithm: gcra, limit: 2}
  - {id: per-ip, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 2, window: 1h}
`

// TestCandidate: candidates are evaluated on every check of their live rule, the denied ones
// too (the over-limit cache, on by default, does not answer them), never decide, and are
// charged as if they had replaced the live rule: a check that only the live rule denies
// charges them, one that another limit denies does not.
func TestCandidate(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, candidateRules)})
	check := func(user, ip string) map[string]bool {
		t.Helper()
		q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}, {Dimension: rules.DimensionIP, ID: ip}}, Endpoint: "/api/x", Cost: 1}
		out, err := e.Check(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{"allowed": out.Allowed}
		for _, l := range out.Limits {
			got[l.Rule.ID] = l.Result.Allowed
			if c := l.Rule.CandidateOf; c != "" && c != "live" {
				t.Errorf("%s: candidate of %q, want live", l.Rule.ID, c)
			}
		}
		if d := out.DecidingLimit(); d == nil || d.Rule.CandidateOf != "" {
			t.Errorf("deciding limit %v, want a live one", d)
		}
		return got
	}
	user := checkertest.ID(t, "u")
	// A fresh address per check: only the user's rules deny.
	for i, want := range []struct{ live, raise, lower bool }{
		{true, true, true}, {true, true, true}, {true, true, false}, {false, true, false}, {false, true, false}, {false, false, false}, {false, false, false},
	} {
		got := check(user, checkertest.IP(t, "a"+strconv.Itoa(i)))
		for _, rule := range []string{"raise", "lower"} {
			if _, ok := got[rule]; !ok {
				t.Fatalf("check %d: candidate %s not evaluated (%v)", i+1, rule, got)
			}
		}
		if got["allowed"] != want.live || got["live"] != want.live || got["raise"] != want.raise || got["lower"] != want.lower {
			t.Errorf("check %d: got %v, want allowed and live %v, raise %v, lower %v", i+1, got, want.live, want.raise, want.lower)
		}
	}

	// Another limit denying (the address's, 2) refunds the candidates: the live rule would
	// allow the third check, and the raise stays at 2 used.
	other, ip := checkertest.ID(t, "v"), checkertest.IP(t, "b")
	for i, want := range []bool{true, true, false, false} {
		if got := check(other, ip); got["allowed"] != want || !got["raise"] || !got["live"] {
			t.Errorf("check %d of one address: got %v, want allowed %v, live and raise allowing", i+1, got, want)
		}
	}
	out, err := e.Peek(context.Background(), &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: other}}, Endpoint: "/api/x", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range out.Limits {
		if l.Rule.ID == "raise" && l.Result.Used != 2 {
			t.Errorf("raise used %d after checks the address's limit denied, want 2 (refunded)", l.Result.Used)
		}
	}
}
