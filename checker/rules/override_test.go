package rules

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

const overrideDoc = `
default_tier: free
tiers: {free: {}, premium: {}}
warnings: {enter: 0.9, exit: 0.5, quiet_period: 10s}
policies:
  penalty: {throttled: 30s, within: 5m, factor: 0.5, duration: 10m}
  tier_protection:
    - {tier: free, capacity: 1000, window: 1m, factor: 0.5, duration: 30s}
rules:
  - {id: u-min, dimension: user, endpoint: "*", algorithm: token_bucket, limit: 100, window: 1m, warning: {enter: 0.6}}
  - {id: u-burst, dimension: user, endpoint: /x/*, algorithm: gcra, limit: 10, window: 1s, burst: 20}
  - {id: ip-min, dimension: ip, endpoint: "*", algorithm: fixed_window, limit: 50, window: 1m}
  - {id: global, dimension: global, endpoint: "*", algorithm: fixed_window, limit: 1000, window: 1s}
`

func TestThresholdsAndPolicies(t *testing.T) {
	t.Parallel()
	s := mustParse(t, overrideDoc)
	if got, want := s.Thresholds("u-min"), (Thresholds{Enter: 0.6, Exit: 0.5, QuietPeriod: 10 * time.Second}); got != want {
		t.Errorf("Thresholds(u-min) = %+v, want %+v (own enter, inherited exit and quiet period)", got, want)
	}
	if got, want := s.Thresholds("ip-min"), (Thresholds{Enter: 0.9, Exit: 0.5, QuietPeriod: 10 * time.Second}); got != want {
		t.Errorf("Thresholds(ip-min) = %+v, want %+v", got, want)
	}
	if got := mustParse(t, sample).Thresholds("user-all"); got != DefaultThresholds {
		t.Errorf("Thresholds without warnings: = %+v, want %+v", got, DefaultThresholds)
	}
	p := s.Policies()
	if p.Penalty == nil || *p.Penalty != (Penalty{Throttled: 30 * time.Second, Within: 5 * time.Minute, Factor: 0.5, Duration: 10 * time.Minute}) {
		t.Errorf("Penalty = %+v", p.Penalty)
	}
	if len(p.TierProtection) != 1 || p.TierProtection[0] != (TierProtection{Tier: "free", Capacity: 1000, Window: time.Minute, Factor: 0.5, Duration: 30 * time.Second}) {
		t.Errorf("TierProtection = %+v", p.TierProtection)
	}
}

func TestDocumentProblems(t *testing.T) {
	t.Parallel()
	base := "rules:\n  - {id: r, dimension: user, endpoint: \"*\", algorithm: fixed_window, limit: 10, window: 1s}\n"
	tests := []struct {
		name, doc, want string
	}{
		{"exit above enter", base + "warnings: {enter: 0.5, exit: 0.6}\n", "warnings: exit: 0.6 must be below enter"},
		{"ratio above 1", base + "warnings: {enter: 1.5}\n", "warnings: enter: want a usage ratio"},
		{"bad quiet period", base + "warnings: {quiet_period: soon}\n", "warnings: quiet_period: want a positive Go duration"},
		{"rule exit above inherited enter", "rules:\n  - {id: r, dimension: user, endpoint: \"*\", algorithm: fixed_window, limit: 10, window: 1s, warning: {exit: 0.85}}\n", `rule "r" (rules[0]): warning: exit: 0.85 must be below enter`},
		{"penalty factor", base + "policies: {penalty: {throttled: 1m, within: 5m, factor: 2, duration: 1m}}\n", "policies.penalty: factor: want a factor above 0 and below 1"},
		{"penalty throttled >= within", base + "policies: {penalty: {throttled: 5m, within: 5m, factor: 0.5, duration: 1m}}\n", "policies.penalty: throttled: 5m0s must be shorter than within"},
		{"protected tier unknown", base + "policies: {tier_protection: [{tier: gold, capacity: 10, factor: 0.5}]}\n", `policies.tier_protection[0]: tier: "gold" is not declared`},
		{"protection capacity", base + "policies: {tier_protection: [{tier: default, capacity: lots, factor: 0.5}]}\n", "policies.tier_protection[0]: capacity: want a whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse error = %v, want a ValidationError containing %q", err, tt.want)
			}
		})
	}
}

func TestDocumentJSONRoundTrip(t *testing.T) {
	t.Parallel()
	d, err := Decode([]byte(overrideDoc))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"limit":100,`) || !strings.Contains(string(data), `"window":"1m"`) {
		t.Errorf("JSON %s: want numbers bare and durations as strings", data)
	}
	var back Document
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	s, err := back.Compile()
	if err != nil {
		t.Fatalf("compile after a JSON round trip: %v", err)
	}
	if r, _ := s.Rule("u-burst"); r.Burst != 20 || r.Limit != 10 {
		t.Errorf("u-burst after round trip: limit %d burst %d, want 10 and 20", r.Limit, r.Burst)
	}
	// JSON input with a string number and an unknown field.
	if _, err := Decode([]byte(`{"rules": [{"id": "a", "dimension": "user", "endpoint": "*", "algorithm": "gcra", "limit": "5", "window": "1s"}]}`)); err != nil {
		t.Errorf("Decode JSON: %v", err)
	}
	if _, err := Decode([]byte(`{"rules": [], "bogus": 1}`)); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("Decode with an unknown field: err = %v, want it named", err)
	}
}

func TestValidateOverride(t *testing.T) {
	t.Parallel()
	s := mustParse(t, overrideDoc)
	now := time.Now()
	ok := Override{ID: "o1", Dimension: "user", Identifier: "alice", Limit: 5, Reason: "r", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	tests := []struct {
		name   string
		change func(o *Override)
		field  string
	}{
		{"valid subject", func(o *Override) {}, ""},
		{"valid tier", func(o *Override) { o.Dimension, o.Identifier, o.Tier = "", "", "premium" }, ""},
		{"valid rule", func(o *Override) { o.Dimension, o.Identifier, o.RuleID = "", "", "global" }, ""},
		{"bad id", func(o *Override) { o.ID = "a b" }, "id"},
		{"no limit", func(o *Override) { o.Limit = 0 }, "limit"},
		{"both", func(o *Override) { o.Multiplier = 2 }, "limit"},
		{"negative multiplier", func(o *Override) { o.Limit, o.Multiplier = 0, -1 }, "multiplier"},
		{"no reason", func(o *Override) { o.Reason = "" }, "reason"},
		{"no duration", func(o *Override) { o.ExpiresAt = o.CreatedAt }, "duration"},
		{"unknown rule", func(o *Override) { o.RuleID = "nope" }, "rule_id"},
		{"rule of another dimension", func(o *Override) { o.RuleID = "ip-min" }, "rule_id"},
		{"global subject", func(o *Override) { o.Dimension = "global" }, "dimension"},
		{"empty identifier", func(o *Override) { o.Identifier = ""; o.Dimension = "ip" }, "identifier"},
		{"subject and tier", func(o *Override) { o.Tier = "free" }, "tier"},
		{"unknown tier", func(o *Override) { o.Dimension, o.Identifier, o.Tier = "", "", "gold" }, "tier"},
		{"no target", func(o *Override) { o.Dimension, o.Identifier = "", "" }, "rule_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := ok
			tt.change(&o)
			err := s.ValidateOverride(&o)
			var fe *field.Error
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("ValidateOverride = %v, want nil", err)
			case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
				t.Fatalf("ValidateOverride = %v, want a FieldError on %q", err, tt.field)
			}
		})
	}
}

func TestEffective(t *testing.T) {
	t.Parallel()
	s := mustParse(t, overrideDoc)
	now := time.Now()
	ov := func(id string, change func(o *Override)) Override {
		o := Override{ID: id, Reason: "test", CreatedAt: now.Add(-time.Second), ExpiresAt: now.Add(time.Hour)}
		change(&o)
		return o
	}
	umin, _ := s.Rule("u-min")
	burst, _ := s.Rule("u-burst")
	tests := []struct {
		name        string
		ovs         []Override
		rule        *Rule
		custom      int64
		limit, bst  int64
		subjectTier string
	}{
		{"none", nil, umin, 0, 100, 100, "free"},
		{"custom", nil, umin, 40, 40, 40, "free"},
		{"rule limit", []Override{ov("a", func(o *Override) { o.RuleID, o.Limit = "u-min", 7 })}, umin, 0, 7, 7, "free"},
		{"subject beats tier beats rule", []Override{
			ov("a", func(o *Override) { o.RuleID, o.Limit = "u-min", 7 }),
			ov("b", func(o *Override) { o.Tier, o.Limit = "free", 8 }),
			ov("c", func(o *Override) { o.Dimension, o.Identifier, o.Limit = "user", "alice", 9 }),
		}, umin, 0, 9, 9, "free"},
		{"subject override replaces a custom limit", []Override{ov("c", func(o *Override) { o.Dimension, o.Identifier, o.Limit = "user", "alice", 200 })}, umin, 40, 200, 200, "free"},
		{"other subject", []Override{ov("c", func(o *Override) { o.Dimension, o.Identifier, o.Limit = "user", "bob", 9 })}, umin, 0, 100, 100, "free"},
		{"other tier", []Override{ov("b", func(o *Override) { o.Tier, o.Limit = "premium", 8 })}, umin, 0, 100, 100, "free"},
		{"narrowed to another rule", []Override{ov("c", func(o *Override) { o.Dimension, o.Identifier, o.RuleID, o.Limit = "user", "alice", "u-burst", 9 })}, umin, 0, 100, 100, "free"},
		{"multipliers compound", []Override{
			ov("p", func(o *Override) { o.Dimension, o.Identifier, o.Multiplier = "user", "alice", 0.5 }),
			ov("t", func(o *Override) { o.Tier, o.Multiplier = "free", 0.5 }),
		}, umin, 0, 25, 25, "free"},
		{"limit then multiplier", []Override{
			ov("l", func(o *Override) { o.RuleID, o.Limit = "u-min", 60 }),
			ov("t", func(o *Override) { o.Tier, o.Multiplier = "free", 0.5 }),
		}, umin, 0, 30, 30, "free"},
		{"multiplier scales an explicit burst", []Override{ov("t", func(o *Override) { o.Tier, o.Multiplier = "free", 0.5 })}, burst, 0, 5, 10, "free"},
		{"expired", []Override{ov("x", func(o *Override) { o.RuleID, o.Limit, o.ExpiresAt = "u-min", 7, now })}, umin, 0, 100, 100, "free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set := s.WithOverrides(tt.ovs)
			limit, burst := set.Effective(tt.rule, DimensionUser, "alice", tt.subjectTier, tt.custom, now)
			if limit != tt.limit || burst != tt.bst {
				t.Errorf("Effective = limit %d burst %d, want %d and %d", limit, burst, tt.limit, tt.bst)
			}
		})
	}
	if s.HasOverrides() || !s.WithOverrides([]Override{ov("a", func(o *Override) { o.RuleID, o.Limit = "u-min", 7 })}).HasOverrides() {
		t.Error("HasOverrides: want false without overrides and true with one")
	}
}

func BenchmarkEffectiveWithOverrides(b *testing.B) {
	s := mustParse(b, overrideDoc)
	now := time.Now()
	var ovs []Override
	for i := range 1000 {
		ovs = append(ovs, Override{ID: "s" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10)), Dimension: "user", Identifier: "u" + string(rune(i)), Limit: 5, Reason: "r", CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	}
	ovs = append(ovs, Override{ID: "tier", Tier: "free", Multiplier: 0.5, Reason: "r", CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	set := s.WithOverrides(ovs)
	r, _ := set.Rule("u-min")
	b.ReportAllocs()
	for b.Loop() {
		set.Effective(r, DimensionUser, "alice", "free", 0, now)
	}
}
