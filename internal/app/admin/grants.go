package admin

import (
	"net/http"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
)

// The grants of entitlements: made and voided with a write token, each an audited config
// event; listed, with what each has left, with a read token. They live with the balances in
// Redis (checker.Engine.PutGrant), so these calls need Redis as well as the rule store.

// GrantBalance is one grant as the API answers it.
type GrantBalance struct {
	rules.Grant
	Remaining int64     `json:"remaining"`
	Live      bool      `json:"live"`
	IssuedFor time.Time `json:"issued_for"`
}

// BalanceView is a subject's balance of an entitlement as the API answers it.
type BalanceView struct {
	Entitlement string         `json:"entitlement"`
	Dimension   string         `json:"dimension"`
	Subject     string         `json:"subject"`
	PeriodStart time.Time      `json:"period_start"`
	PeriodEnd   time.Time      `json:"period_end"`
	Used        int64          `json:"used"`
	Overage     int64          `json:"overage"`
	Remaining   int64          `json:"remaining"`
	Grants      []GrantBalance `json:"grants"`
}

func balanceView(b checker.Balance) BalanceView {
	v := BalanceView{Entitlement: b.Entitlement, Dimension: b.Dimension, Subject: b.Subject, PeriodStart: b.PeriodStart,
		PeriodEnd: b.PeriodEnd, Used: b.Used, Overage: b.Overage, Remaining: b.Remaining, Grants: []GrantBalance{}}
	for _, g := range b.Grants {
		v.Grants = append(v.Grants, GrantBalance{Grant: g.Grant, Remaining: g.Remaining, Live: g.Live, IssuedFor: g.IssuedFor})
	}
	return v
}

// GrantResult is the answer to a grant made or voided: the grant and its holder's balance after.
type GrantResult struct {
	Grant   rules.Grant `json:"grant"`
	Balance BalanceView `json:"balance"`
}

// createGrant makes a grant (POST /api/v1/grants): its maker is the token's name.
func (a *API) createGrant(r *http.Request, c caller) (int, any, error) {
	var g rules.Grant
	if err := decodeBody(r, &g); err != nil {
		return 0, nil, err
	}
	if !g.CreatedAt.IsZero() || !g.VoidedAt.IsZero() || g.Creator != "" {
		return 0, nil, badField("created_at", "created_at, voided_at and creator are the API's to set")
	}
	g.Creator = c.Name
	made, b, err := a.engine.PutGrant(r.Context(), g)
	if err != nil {
		return 0, nil, err
	}
	if err := a.store.RecordGrant(r.Context(), events.ConfigGrantIssued, c.Name, events.NewGrantDetail(made, b.PeriodStart, b.PeriodEnd, 0)); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: grant made", "token", c.Name, "grant", made.ID, "entitlement", made.Entitlement,
		"subject", made.Dimension+":"+made.Subject, "amount", made.Amount)
	return http.StatusCreated, GrantResult{Grant: made, Balance: balanceView(b)}, nil
}

// voidGrant voids a grant (POST /api/v1/grants/{id}/void) from now on.
func (a *API) voidGrant(r *http.Request, c caller) (int, any, error) {
	var body struct {
		Entitlement string `json:"entitlement"`
		Subject     string `json:"subject"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	id := r.PathValue("id")
	b, err := a.engine.VoidGrant(r.Context(), body.Entitlement, body.Subject, id)
	if err != nil {
		return 0, nil, err
	}
	g := findGrant(b, id)
	if g == nil { // voided, then dropped by a period's roll in between: nothing to show
		return 0, nil, notFound("grant %q of %s %s", id, body.Entitlement, body.Subject)
	}
	// What the grant had left at its void is forfeited: the ledger counts it from this event.
	var forfeited int64
	for _, gb := range b.Grants {
		if gb.ID == id {
			forfeited = gb.Remaining
		}
	}
	if err := a.store.RecordGrant(r.Context(), events.ConfigGrantVoided, c.Name, events.NewGrantDetail(*g, b.PeriodStart, b.PeriodEnd, forfeited)); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: grant voided", "token", c.Name, "grant", id, "entitlement", body.Entitlement, "subject", body.Subject)
	return http.StatusOK, GrantResult{Grant: *g, Balance: balanceView(b)}, nil
}

// listGrants answers a subject's balance of an entitlement and its grants (GET
// /api/v1/grants?entitlement=…&subject=…).
func (a *API) listGrants(r *http.Request, _ caller) (int, any, error) {
	q := r.URL.Query()
	if q.Get("entitlement") == "" {
		return 0, nil, badField("entitlement", "required: the entitlement whose balance to list")
	}
	b, err := a.engine.Balance(r.Context(), q.Get("entitlement"), q.Get("subject"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, balanceView(b), nil
}

// findGrant returns grant id of b, nil for none.
func findGrant(b checker.Balance, id string) *rules.Grant {
	for i := range b.Grants {
		if b.Grants[i].ID == id {
			return &b.Grants[i].Grant
		}
	}
	return nil
}
