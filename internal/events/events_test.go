package events

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/rules"
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
			"2026-11-24 10:00:00.000001 free       user:bob                 orders           normal    → warning   usage=0.90 1/10 window=60000ms cause=decision id=wt-1"},
		{"subject override", &OverrideEvent{Action: OverrideCreated, At: at, Actor: "alice", Override: rules.Override{ID: "ovr-1",
			Dimension: "user", Identifier: "bob", RuleID: "orders", Limit: 20, Source: "admin", Reason: "launch", ExpiresAt: at.Add(time.Hour)}},
			`2026-11-24 10:00:00 CREATED ovr-1                subject user:bob rule=orders     limit=20     until 2026-11-24 11:00:00 by alice (admin) reason="launch"`},
		{"tier override", &OverrideEvent{Action: OverrideExpired, At: at, Actor: "system", Override: rules.Override{ID: "ovr-2",
			Tier: "free", Multiplier: 0.5, Source: "policy", ExpiresAt: at}},
			`2026-11-24 10:00:00 EXPIRED ovr-2                tier free                        x0.5         until 2026-11-24 10:00:00 by system (policy) reason=""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ev.String(); got != tt.want {
				t.Errorf("String()\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}
