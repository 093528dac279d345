package rules

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
)

const entitlementRules = "rules:\n- {id: r, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1m}\nentitlements:\n- "

// TestEntitlement: a declared entitlement compiles to what it says; each part has its default.
func TestEntitlement(t *testing.T) {
	t.Parallel()
	s := mustParse(t, entitlementRules+`{id: llm-tokens, dimension: user, endpoints: [/v1/chat/*, /v1/complete], period: 1mo,
    timezone: Europe/Berlin, anchor_day: 15, mode: soft, overage_cap: 100000,
    thresholds: {used_percent: [100, 50, 80], balance_below: [1000], expiring_within: [72h]}}
- {id: reports, dimension: tenant, period: 1d}`)
	e, ok := s.Entitlement("llm-tokens")
	if !ok {
		t.Fatal("no entitlement llm-tokens")
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	if e.Dimension != DimensionUser || !e.Soft || e.OverageCap != 100000 || e.Period.Unit != calendar.Month ||
		e.Period.Location.String() != berlin.String() || e.Period.AnchorDay != 15 {
		t.Errorf("llm-tokens = %+v", e)
	}
	if want := []int{50, 80, 100}; !slices.Equal(e.Thresholds.UsedPercent, want) {
		t.Errorf("used_percent = %v, want %v (ascending)", e.Thresholds.UsedPercent, want)
	}
	if e.Thresholds.BalanceBelow[0] != 1000 || e.Thresholds.ExpiringWithin[0] != 72*time.Hour {
		t.Errorf("thresholds = %+v", e.Thresholds)
	}
	r, _ := s.Entitlement("reports")
	if r.Dimension != DimensionDescriptor || r.Key != "tenant" || r.Soft || r.OverageCap != NoCap || r.Period.Location != time.UTC {
		t.Errorf("reports = %+v, want a hard, daily, UTC balance per tenant", r)
	}
	for _, tt := range []struct {
		endpoint string
		want     bool
	}{{"/v1/chat", true}, {"/v1/chat/completions", true}, {"/v1/complete", true}, {"/v1/completed", false}, {"/v1/chatter", false}} {
		if got := e.Burns(tt.endpoint); got != tt.want {
			t.Errorf("Burns(%q) = %v, want %v", tt.endpoint, got, tt.want)
		}
	}
	if rule := e.Rule(); rule.ID != "llm-tokens" || rule.Algorithm != algorithm.Balance || rule.FailMode != FailOpen ||
		rule.Entitlement != e || rule.WindowName() != "1mo" || rule.Dimension != DimensionUser {
		t.Errorf("llm-tokens's rule = %+v, want a balance of the entitlement's id, failing open, over 1mo", rule)
	}
	if _, ok := s.Entitlement("nope"); ok || len(s.Entitlements()) != 2 || !s.HasEntitlements() {
		t.Errorf("Entitlements = %d, want 2 and no entitlement nope", len(s.Entitlements()))
	}
}

// TestEntitlementErrors: each bad field is refused naming the entitlement and the field.
func TestEntitlementErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, entitlement, want string
	}{
		{"no id", "{dimension: user, period: 1mo}", "entitlements[0]: id: required"},
		{"no dimension", "{id: e, period: 1mo}", "entitlements[0]: dimension: required"},
		{"global", "{id: e, dimension: global, period: 1mo}", "entitlements[0]: dimension: global subjects hold no balances"},
		{"ip", "{id: e, dimension: ip, period: 1mo}", "entitlements[0]: dimension: ip subjects hold no balances"},
		{"typo of a dimension", "{id: e, dimension: users, period: 1mo}", `entitlements[0]: dimension: unknown dimension "users"`},
		{"no period", "{id: e, dimension: user}", `entitlements[0]: period: want 1d, 1w, 1mo or 1y, got ""`},
		{"a duration", "{id: e, dimension: user, period: 30d}", `entitlements[0]: period: want 1d, 1w, 1mo or 1y, got "30d"`},
		{"bad zone", "{id: e, dimension: user, period: 1d, timezone: Mars/Olympus}", `entitlements[0]: timezone: unknown time zone "Mars/Olympus"`},
		{"anchor of a week", "{id: e, dimension: user, period: 1w, anchor_day: 3}", "entitlements[0]: anchor_day: only monthly periods"},
		{"bad mode", "{id: e, dimension: user, period: 1mo, mode: lenient}", `entitlements[0]: mode: want hard or soft, got "lenient"`},
		{"cap of a hard one", "{id: e, dimension: user, period: 1mo, overage_cap: 5}", "entitlements[0]: overage_cap: only a soft entitlement"},
		{"negative cap", "{id: e, dimension: user, period: 1mo, mode: soft, overage_cap: -5}", "entitlements[0]: overage_cap: want a whole number from 0 to 17592186044416"},
		{"huge cap", "{id: e, dimension: user, period: 1mo, mode: soft, overage_cap: 99999999999999999999}", "overage_cap: want a whole number"},
		{"bad endpoint", "{id: e, dimension: user, period: 1mo, endpoints: [v1/chat]}", `entitlements[0]: endpoints[0]: "v1/chat" must start with "/"`},
		{"percent over 100", "{id: e, dimension: user, period: 1mo, thresholds: {used_percent: [120]}}", `used_percent[0]: want a percentage from 1 to 100, got "120"`},
		{"zero balance", "{id: e, dimension: user, period: 1mo, thresholds: {balance_below: [0]}}", "balance_below[0]: want a whole number from 1"},
		{"negative expiry", "{id: e, dimension: user, period: 1mo, thresholds: {expiring_within: [-1h]}}", `expiring_within[0]: want a duration from 1s`},
		{"twice", "{id: e, dimension: user, period: 1mo, thresholds: {used_percent: [80, 80]}}", "a threshold is listed twice"},
		{"local fail mode", "{id: e, dimension: user, period: 1mo, fail_mode: local}", `fail_mode: want open or closed, got "local" (a balance lives only in Redis`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(entitlementRules + tt.entitlement))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := Parse([]byte(entitlementRules + "{id: e, dimension: user, period: 1d}\n- {id: e, dimension: org, period: 1mo}")); err == nil || !strings.Contains(err.Error(), `id: "e" is used by more than one entitlement`) {
		t.Errorf("duplicate id: got %v", err)
	}
	if _, err := Parse([]byte(entitlementRules + "{id: r, dimension: user, period: 1d}")); err == nil || !strings.Contains(err.Error(), `entitlements[0]: id: "r" is a rule's id`) {
		t.Errorf("an entitlement with a rule's id: got %v", err)
	}
	s := mustParse(t, entitlementRules+"{id: e, dimension: user, period: 1d, fail_mode: closed}")
	if e, _ := s.Entitlement("e"); e.Rule().FailMode != FailClosed {
		t.Errorf("fail_mode closed: the rule fails %v", e.Rule().FailMode)
	}
}

// TestValidateGrant: a grant is completed (dimension, priority) and each bad field is named.
func TestValidateGrant(t *testing.T) {
	t.Parallel()
	s := mustParse(t, entitlementRules+"{id: tokens, dimension: user, period: 1mo}\n- {id: seats, dimension: tenant, period: 1mo}")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	good := func() Grant {
		return Grant{Entitlement: "tokens", Subject: "erin", Amount: 1000, Reason: "pro plan", Recurring: true, Rollover: &Rollover{Max: 200}}
	}
	g := good()
	if err := s.ValidateGrant(&g, now); err != nil || g.Dimension != "user" || g.Priority != 1 {
		t.Fatalf("ValidateGrant = %v, grant %+v; want it valid, of dimension user, priority 1", err, g)
	}
	tests := []struct {
		name      string
		edit      func(*Grant)
		wantField string
		wantMsg   string
	}{
		{"bad id", func(g *Grant) { g.ID = "a b" }, "id", "must match"},
		{"no entitlement", func(g *Grant) { g.Entitlement = "" }, "entitlement", "required"},
		{"unknown entitlement", func(g *Grant) { g.Entitlement = "gold" }, "entitlement", `no entitlement has id "gold"`},
		{"other dimension", func(g *Grant) { g.Dimension = "apikey" }, "dimension", `entitlement "tokens" is held per user, not per apikey`},
		{"custom dimension", func(g *Grant) { g.Entitlement, g.Dimension = "seats", "org" }, "dimension", "held per tenant, not per org"},
		{"no subject", func(g *Grant) { g.Subject = "" }, "subject", "required"},
		{"zero amount", func(g *Grant) { g.Amount = 0 }, "amount", "want a whole number from 1"},
		{"negative amount", func(g *Grant) { g.Amount = -5 }, "amount", "got -5"},
		{"huge amount", func(g *Grant) { g.Amount = MaxAmount + 1 }, "amount", "to 17592186044416"},
		{"bad priority", func(g *Grant) { g.Priority = 1001 }, "priority", "want 1 (burned first) to 1000"},
		{"back-dated", func(g *Grant) { g.EffectiveAt = now.Add(-time.Hour) }, "effective_at", "is in the past"},
		{"expired", func(g *Grant) { g.ExpiresAt = now.Add(-time.Second) }, "expires_at", "is not after the grant starts"},
		{"expires before it starts", func(g *Grant) { g.EffectiveAt, g.ExpiresAt = now.Add(2*time.Hour), now.Add(time.Hour) }, "expires_at", "not after"},
		{"rollover of a one-off", func(g *Grant) { g.Recurring = false }, "rollover", "only a recurring grant"},
		{"rollover over the amount", func(g *Grant) { g.Rollover = &Rollover{Max: 2000} }, "rollover", "max <= amount (1000)"},
		{"rollover min over max", func(g *Grant) { g.Rollover = &Rollover{Min: 300, Max: 200} }, "rollover", "min 300 and max 200"},
		{"no reason", func(g *Grant) { g.Reason = "" }, "reason", "required"},
		{"a reason too long", func(g *Grant) { g.Reason = strings.Repeat("x", MaxReasonLen+1) }, "reason", "at most 1024 bytes"},
		{"a subject too long", func(g *Grant) { g.Subject = strings.Repeat("s", MaxIdentifierLen+1) }, "subject", "1 to 256 bytes"},
		{"a subject not UTF-8", func(g *Grant) { g.Subject = "\xff" }, "subject", "valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := good()
			tt.edit(&g)
			err := s.ValidateGrant(&g, now)
			var fe *field.Error
			if !errors.As(err, &fe) || fe.Field != tt.wantField || !strings.Contains(fe.Msg, tt.wantMsg) {
				t.Errorf("ValidateGrant = %v, want a *field.Error of %s saying %q", err, tt.wantField, tt.wantMsg)
			}
		})
	}
}

// TestGrantBurnOrder: priority first, then the earliest expiry (never expiring last), then
// the oldest, then the id.
func TestGrantBurnOrder(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	grants := []Grant{
		{ID: "topup", Priority: 2, CreatedAt: t0.Add(time.Hour)},
		{ID: "promo", Priority: 1, ExpiresAt: t0.AddDate(0, 2, 0), CreatedAt: t0.Add(2 * time.Hour)},
		{ID: "plan", Priority: 1, CreatedAt: t0},
		{ID: "bonus", Priority: 1, ExpiresAt: t0.AddDate(0, 1, 0), CreatedAt: t0.Add(3 * time.Hour)},
		{ID: "older-topup", Priority: 2, CreatedAt: t0},
	}
	slices.SortFunc(grants, func(a, b Grant) int {
		if a.Before(&b) {
			return -1
		}
		return 1
	})
	var got []string
	for _, g := range grants {
		got = append(got, g.ID)
	}
	if want := []string{"bonus", "promo", "plan", "older-topup", "topup"}; !slices.Equal(got, want) {
		t.Errorf("burn order = %v, want %v", got, want)
	}
}
