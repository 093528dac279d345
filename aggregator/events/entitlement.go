package events

import (
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// The kinds of entitlement events: which threshold of an entitlement a subject's balance
// crossed (rules.EntitlementThresholds), as the rules document and the check API name them.
const (
	EntitlementUsedPercent   = "used_percent"
	EntitlementBalanceBelow  = "balance_below"
	EntitlementGrantExpiring = "grant_expiring"
)

// EntitlementEvent is a threshold of an entitlement crossed by a subject's balance: told once
// per period (a grant's expiry once per grant) by the check, or recorded usage, that crossed it
// first, on quotaflow.entitlements.<kind>, and delivered to the webhook endpoints. Its ID is
// the deciding decision's id with the threshold, so that the event made again from a
// redelivered decision is the same event (and the same webhook-id).
type EntitlementEvent struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Entitlement and the holder: Dimension is user, apikey, org or the custom dimension's
	// name; Subject the holder's id (a custom dimension's value).
	Entitlement string `json:"entitlement"`
	Dimension   string `json:"dimension"`
	Subject     string `json:"subject"`
	Tier        string `json:"tier,omitempty"`
	// Threshold is the threshold crossed: a percentage, an amount, or a duration in ms.
	Threshold int64 `json:"threshold"`
	// GrantID is, for grant_expiring, the grant about to expire.
	GrantID string `json:"grant_id,omitempty"`
	// Used and Remaining are the balance's after the crossing check: the period's usage, and
	// what the live grants have left; PeriodEnd ends the period.
	Used      int64     `json:"used"`
	Remaining int64     `json:"remaining"`
	PeriodEnd time.Time `json:"period_end"`
	// DecisionID is the decision (a check, a reservation, recorded usage) that crossed it.
	DecisionID string    `json:"decision_id"`
	At         time.Time `json:"at"`
}

// NATSSubject is the event's subject: quotaflow.entitlements.<kind>.
func (e *EntitlementEvent) NATSSubject() string { return EntitlementsPrefix + "." + token(e.Kind) }

// Type is the event's type as webhooks name it: entitlement.<kind>.
func (e *EntitlementEvent) Type() string { return "entitlement." + e.Kind }

// String is the event as one line, for people watching the stream (quotaflow watch
// entitlements).
func (e *EntitlementEvent) String() string {
	what := fmt.Sprintf("%s=%d", e.Kind, e.Threshold)
	if e.Kind == EntitlementGrantExpiring {
		what = fmt.Sprintf("grant %s expiring within %s", e.GrantID, time.Duration(e.Threshold)*time.Millisecond)
	}
	return fmt.Sprintf("%s %-14s %-28s %s used=%d remaining=%d id=%s",
		e.At.UTC().Format("2006-01-02 15:04:05.000"), e.Entitlement, e.Dimension+":"+e.Subject, what, e.Used, e.Remaining, e.ID)
}

// GrantDetail is the detail of a grant_issued or grant_voided config event: the grant, with
// what the grant ledger needs of it, which ClickHouse reads by these field names (schema
// 0013): its start and expiry in Unix ms (0: now, never), the balance's period when it was
// made or voided (Unix s), and, for a void, what the grant had left, forfeited.
type GrantDetail struct {
	rules.Grant
	EffectiveMs  int64 `json:"effective_ms"`
	ExpiresMs    int64 `json:"expires_ms"`
	PeriodStartS int64 `json:"period_start_s"`
	PeriodEndS   int64 `json:"period_end_s"`
	Forfeited    int64 `json:"forfeited,omitempty"`
}

// NewGrantDetail is the detail of grant g's event in the period [start, end); forfeited is a
// void's.
func NewGrantDetail(g rules.Grant, start, end time.Time, forfeited int64) GrantDetail {
	d := GrantDetail{Grant: g, PeriodStartS: start.Unix(), PeriodEndS: end.Unix(), Forfeited: forfeited}
	if !g.EffectiveAt.IsZero() {
		d.EffectiveMs = g.EffectiveAt.UnixMilli()
	} else if !g.CreatedAt.IsZero() {
		d.EffectiveMs = g.CreatedAt.UnixMilli()
	}
	if !g.ExpiresAt.IsZero() {
		d.ExpiresMs = g.ExpiresAt.UnixMilli()
	}
	return d
}
