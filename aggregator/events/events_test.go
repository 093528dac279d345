package events

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
)

func TestString(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 10, 0, 0, 1000, time.UTC)
	tests := []struct {
		name string
		ev   interface{ String() string }
		want string
	}{
		{"transition", &Transition{ID: "wt-1", Tier: "free", Dimension: "user", Subject: "bob", RuleID: "orders", From: StateNormal,
			To: StateWarning, UsageRatio: 0.9, Limit: 10, Remaining: 1, WindowMs: 60000, At: at, Cause: "decision"},
			"2026-11-24 10:00:00.000001 free       user:bob                 orders           normal    → warning   usage=0.90 1/10 window=1m cause=decision id=wt-1"},
		{"subject override", &OverrideEvent{Action: OverrideCreated, At: at, Actor: "alice", Override: rules.Override{ID: "ovr-1",
			Dimension: "user", Identifier: "bob", RuleID: "orders", Limit: 20, Source: "admin", Reason: "launch", ExpiresAt: at.Add(time.Hour)}},
			`2026-11-24 10:00:00 CREATED ovr-1                user:bob rule:orders             limit=20     until 2026-11-24 11:00:00 by alice (admin) reason="launch"`},
		{"tier override", &OverrideEvent{Action: OverrideExpired, At: at, Actor: "system", Override: rules.Override{ID: "ovr-2",
			Tier: "free", Multiplier: 0.5, Source: "policy", ExpiresAt: at}},
			`2026-11-24 10:00:00 EXPIRED ovr-2                tier:free                        limit×0.5    until 2026-11-24 10:00:00 by system (policy) reason=""`},
		{"rule config", &ConfigEvent{ID: "config-rule_created-7", Action: ConfigRuleCreated, At: at, Actor: "alice-ops", RuleID: "orders"},
			"2026-11-24 10:00:00 RULE_CREATED  rule orders                      by alice-ops id=config-rule_created-7"},
		{"user config", &ConfigEvent{ID: "config-user_tier_set-9", Action: ConfigUserTierSet, At: at, Actor: "alice-ops", UserID: "bob", Tier: "premium"},
			"2026-11-24 10:00:00 USER_TIER_SET user bob tier=premium            by alice-ops id=config-user_tier_set-9"},
		{"document config", &ConfigEvent{ID: "config-rules_applied-3", Action: ConfigRulesApplied, At: at, Actor: "ci"},
			"2026-11-24 10:00:00 RULES_APPLIED document                         by ci id=config-rules_applied-3"},
		{"pruning document config", &ConfigEvent{ID: "config-rules_applied-4", Action: ConfigRulesApplied, At: at, Actor: "ci", Removed: []string{"rule orders", "exemption acme"}},
			"2026-11-24 10:00:00 RULES_APPLIED document                         by ci id=config-rules_applied-4 removed=rule orders,exemption acme"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ev.String(); got != tt.want {
				t.Errorf("String()\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		subject, want string
	}{
		{(&Transition{Tier: "free", Dimension: "user"}).NATSSubject(), "warning"},
		{(&OverrideEvent{Action: OverrideCreated}).NATSSubject(), "override"},
		{(&ConfigEvent{Action: ConfigRuleDeleted}).NATSSubject(), "config"},
		{"quotaflow.configx.rule_deleted", ""},
		{"quotaflow.decisions.3", ""},
	}
	for _, tt := range tests {
		got, err := Kind(tt.subject)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("Kind(%q) = %q, %v; want %q", tt.subject, got, err, tt.want)
		}
	}
}

// TestSubjects: the stream takes every event's subject.
func TestSubjects(t *testing.T) {
	t.Parallel()
	for _, subject := range []string{
		(&Transition{Tier: "free", Dimension: "user"}).NATSSubject(),
		(&OverrideEvent{Action: OverrideDeleted}).NATSSubject(),
		(&ConfigEvent{Action: ConfigRulesApplied}).NATSSubject(),
	} {
		taken := false
		for _, s := range Subjects() {
			taken = taken || strings.HasPrefix(subject, strings.TrimSuffix(s, ">"))
		}
		if !taken {
			t.Errorf("subject %q is not among the stream's %v", subject, Subjects())
		}
	}
}

func TestConfigEventTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ev   ConfigEvent
		want string
	}{
		{ConfigEvent{Action: ConfigRuleReplaced, RuleID: "orders"}, "orders"},
		{ConfigEvent{Action: ConfigUserTierSet, UserID: "bob", Tier: "free"}, "bob"},
		{ConfigEvent{Action: ConfigRulesApplied}, ""},
	}
	for _, tt := range tests {
		if got := tt.ev.Target(); got != tt.want {
			t.Errorf("%s: Target() = %q, want %q", tt.ev.Action, got, tt.want)
		}
	}
}

// TestOverrideSpelling: the one spelling of an override's target and change, which the events,
// quotaflow override and quotaflow status share.
func TestOverrideSpelling(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		o                  rules.Override
		wantTarget, change string
	}{
		{"subject", rules.Override{Dimension: "user", Identifier: "alice", Limit: 200}, "user:alice", "limit=200"},
		{"subject on a rule", rules.Override{Dimension: "ip", Identifier: "10.0.0.1", RuleID: "r", Multiplier: 0.5}, "ip:10.0.0.1 rule:r", "limit×0.5"},
		{"tier", rules.Override{Tier: "free", Multiplier: 2}, "tier:free", "limit×2"},
		{"rule", rules.Override{RuleID: "r", Limit: 5}, "rule:r", "limit=5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OverrideTarget(&tt.o); got != tt.wantTarget {
				t.Errorf("OverrideTarget = %q, want %q", got, tt.wantTarget)
			}
			if got := OverrideChange(&tt.o); got != tt.change {
				t.Errorf("OverrideChange = %q, want %q", got, tt.change)
			}
		})
	}
}
