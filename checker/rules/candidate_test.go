package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestCandidate: a candidate takes what it leaves out from its live rule, is never matched on
// its own, and is planned from the live rule (Candidates).
func TestCandidate(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`
tiers: {free: {}, pro: {}}
default_tier: free
rules:
  - {id: search, dimension: user, endpoint: /search, tier: pro, algorithm: token_bucket, limit: 10, window: 1m, burst: 20, fail_mode: closed}
  - {id: search-low, candidate_of: search, limit: 5}
  - {id: search-gcra, candidate_of: search, algorithm: gcra, window: 10s}
`))
	if err != nil {
		t.Fatal(err)
	}
	live, _ := s.Rule("search")
	tests := []struct {
		id        string
		algorithm algorithm.ID
		limit     int64
		window    time.Duration
		burst     int64
	}{
		// Only the limit changed: the burst set on the live rule stays.
		{"search-low", algorithm.TokenBucket, 5, time.Minute, 20},
		// Another algorithm: the live rule's burst is not carried over; it defaults to the limit.
		{"search-gcra", algorithm.GCRA, 10, 10 * time.Second, 10},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			c, ok := s.Rule(tt.id)
			switch {
			case !ok:
				t.Fatalf("rule %s missing", tt.id)
			case c.CandidateOf != "search" || !c.Shadow:
				t.Errorf("candidate_of %q shadow %v, want search and true", c.CandidateOf, c.Shadow)
			case c.Dimension != DimensionUser || c.Endpoint != "/search" || c.Tier != "pro" || c.FailMode != FailClosed:
				t.Errorf("got %s %s tier %q fail %s, want the live rule's user /search pro closed", c.Dimension, c.Endpoint, c.Tier, c.FailMode)
			case c.Algorithm != tt.algorithm || c.Limit != tt.limit || c.Window != tt.window || c.Burst != tt.burst:
				t.Errorf("got %s %d/%s burst %d, want %s %d/%s burst %d", c.Algorithm, c.Limit, c.Window, c.Burst, tt.algorithm, tt.limit, tt.window, tt.burst)
			}
		})
	}
	if len(live.Candidates) != 2 || live.Candidates[0].ID != "search-low" || live.Candidates[1].ID != "search-gcra" {
		t.Errorf("live rule's candidates = %v, want search-low and search-gcra in file order", live.Candidates)
	}
	got := s.Match(DimensionUser, "pro", "/search")
	if len(got) != 1 || got[0].ID != "search" {
		t.Errorf("Match = %v, want the live rule alone: a candidate is planned from it", got)
	}
	if doc := s.Document(); doc.Rules[1].Limit != "5" || doc.Rules[1].Endpoint != "" {
		t.Errorf("the document's candidate = %+v, want it as written (not completed)", doc.Rules[1])
	}
}

// TestCandidateErrors: what a candidate may not say is refused naming the field.
func TestCandidateErrors(t *testing.T) {
	t.Parallel()
	const live = "- {id: live, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1m}\n"
	tests := []struct {
		name, rules string
		want        string
	}{
		{"unknown live rule", "- {id: c, candidate_of: nope, limit: 2}", `rule "c" (rules[1]): candidate_of: no rule has id "nope"`},
		{"candidate of a candidate", "- {id: c, candidate_of: live, limit: 2}\n- {id: d, candidate_of: c, limit: 3}", `rule "d" (rules[2]): candidate_of: "c" is itself a candidate (of "live")`},
		{"own id", "- {id: c, candidate_of: c, limit: 2}", `candidate_of: "c" is itself a candidate`},
		{"other endpoint", "- {id: c, candidate_of: live, endpoint: /y, limit: 2}", `rule "c" (rules[1]): endpoint: a candidate is evaluated on its live rule's checks and takes its endpoint ("live"'s)`},
		{"other dimension", "- {id: c, candidate_of: live, dimension: ip, limit: 2}", `dimension: a candidate is evaluated on its live rule's checks`},
		{"other tier", "- {id: c, candidate_of: live, tier: default, limit: 2}", `tier: a candidate is evaluated on its live rule's checks`},
		{"shadow", "- {id: c, candidate_of: live, limit: 2, shadow: true}", `shadow: a candidate takes none`},
		{"lease", "- {id: c, candidate_of: live, limit: 2, lease: {slice: 1}}", `lease: a candidate takes none`},
		{"concurrency", "- {id: c, candidate_of: live, algorithm: concurrency}", `algorithm: a candidate cannot count places in flight`},
		{"burst on a window", "- {id: c, candidate_of: live, burst: 9}", `burst: fixed_window counts up to its limit`},
		{"leased live", "- {id: g, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 100, window: 1m, lease: {slice: 10}}\n- {id: c, candidate_of: g, limit: 50}", `candidate_of: "g" is leased`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte("rules:\n" + live + tt.rules))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
	// The same values as the live rule's are no change, and accepted.
	if _, err := Parse([]byte("rules:\n" + live + "- {id: c, candidate_of: live, dimension: user, endpoint: /x, limit: 2}")); err != nil {
		t.Errorf("a candidate repeating its live rule's dimension and endpoint: %v", err)
	}
}
