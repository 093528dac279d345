package checker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

const grantRules = testRules + `entitlements:
  - {id: tokens, dimension: user, period: 1mo, timezone: Europe/Berlin}
  - {id: seats, dimension: tenant, period: 1d}
`

// TestEngineGrants: grants made, listed with their reasons, voided, through the engine, which
// knows their keys and periods; bad input is named.
func TestEngineGrants(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, grantRules)})
	user := fmt.Sprintf("grants-%d", time.Now().UnixNano()) // one of its own per run (-count)
	made, b, err := e.PutGrant(t.Context(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 1000, Recurring: true,
		Rollover: &rules.Rollover{Max: 200}, Reason: "pro plan", Creator: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	if made.ID != b.Grants[0].ID || made.CreatedAt.IsZero() || made.Dimension != "user" || made.Priority != 1 {
		t.Errorf("the grant as made: %+v, want its id, creation time, dimension and priority", made)
	}
	if len(b.Grants) != 1 || b.Remaining != 1000 || b.Dimension != "user" || !strings.HasPrefix(b.Grants[0].ID, "gr-") ||
		b.Grants[0].Reason != "pro plan" || b.Grants[0].Creator != "ops" || b.Grants[0].Rollover.Max != 200 || !b.Grants[0].Live {
		t.Fatalf("after the first grant: %+v", b)
	}
	if !b.PeriodEnd.After(time.Now()) || b.PeriodStart.After(time.Now()) || b.PeriodStart.Day() != 1 {
		t.Errorf("period %s to %s, want this month in Berlin", b.PeriodStart, b.PeriodEnd)
	}
	id := b.Grants[0].ID
	if _, _, err := e.PutGrant(t.Context(), rules.Grant{ID: "topup", Entitlement: "tokens", Subject: user, Amount: 500, Priority: 2, Reason: "bought"}); err != nil {
		t.Fatal(err)
	}
	if b, err = e.Balance(t.Context(), "tokens", user); err != nil || b.Remaining != 1500 || len(b.Grants) != 2 {
		t.Fatalf("Balance = %+v, %v; want 1500 in two grants", b, err)
	}
	if b, err = e.VoidGrant(t.Context(), "tokens", user, id); err != nil || b.Remaining != 500 {
		t.Fatalf("VoidGrant = %+v, %v; want 500 left, the top-up's", b, err)
	}
	// A custom dimension's grant lives under its descriptor's tag.
	if _, b, err = e.PutGrant(t.Context(), rules.Grant{Entitlement: "seats", Subject: user + "-acme", Amount: 3, Reason: "trial"}); err != nil || b.Dimension != "tenant" {
		t.Fatalf("a tenant's grant: %+v, %v", b, err)
	}

	for _, tt := range []struct {
		name  string
		op    func() error
		is    error
		field string
	}{
		{"another grant of an id", func() error {
			_, _, err := e.PutGrant(t.Context(), rules.Grant{ID: "topup", Entitlement: "tokens", Subject: user, Amount: 7, Reason: "x"})
			return err
		}, rules.ErrExists, ""},
		{"void of an unknown grant", func() error { _, err := e.VoidGrant(t.Context(), "tokens", user, "nope"); return err }, rules.ErrNotFound, ""},
		{"an unknown entitlement", func() error { _, err := e.Balance(t.Context(), "gold", user); return err }, rules.ErrNotFound, ""},
		{"a negative amount", func() error {
			_, _, err := e.PutGrant(t.Context(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: -5, Reason: "x"})
			return err
		}, nil, "amount"},
		{"an expired grant", func() error {
			_, _, err := e.PutGrant(t.Context(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 5, Reason: "x", ExpiresAt: time.Now().Add(-time.Hour)})
			return err
		}, nil, "expires_at"},
		{"no subject", func() error { _, err := e.Balance(t.Context(), "tokens", ""); return err }, nil, "subject"},
		{"an entitlement id too long", func() error { _, err := e.Balance(t.Context(), strings.Repeat("e", 1<<16), user); return err }, nil, "entitlement"},
		{"a grant id too long", func() error {
			_, err := e.VoidGrant(t.Context(), "tokens", user, strings.Repeat("g", 1<<16))
			return err
		}, nil, "id"},
		{"a subject not UTF-8", func() error { _, err := e.Balance(t.Context(), "tokens", "\xff"); return err }, nil, "subject"},
		{"a subject too long", func() error { _, err := e.Balance(t.Context(), "tokens", strings.Repeat("s", 257)); return err }, nil, "subject"},
		{"a void of another subject's grant", func() error { _, err := e.VoidGrant(t.Context(), "tokens", user+"-other", "topup"); return err }, rules.ErrNotFound, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			var fe *field.Error
			switch {
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Errorf("got %v, want %v", err, tt.is)
			case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
				t.Errorf("got %v, want a *field.Error naming %s", err, tt.field)
			}
		})
	}
}
