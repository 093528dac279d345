package admin

import (
	"context"
	"net/http"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/audit"
)

// Ledger reads the grant ledger from ClickHouse (audit.Reader): the billing export per
// period, and a balance recomputed from it.
type Ledger interface {
	EntitlementBilling(ctx context.Context, period, entitlement string) (*audit.BillingPeriod, error)
	Balance(ctx context.Context, entitlement, dimension, subject string, at time.Time) (*audit.LedgerBalance, error)
}

var _ Ledger = (*audit.Reader)(nil)

// billing answers the billing export of a month (GET /api/v1/billing?period=2006-01
// [&entitlement=…][&format=csv]): per entitlement, holder and balance period, what was
// granted, used, used past zero and forfeited.
func (a *API) billing(r *http.Request, _ caller) (int, any, error) {
	if a.ledger == nil {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "billing: this process has no ClickHouse (--audit-clickhouse-dsn)"}
	}
	q := r.URL.Query()
	format := q.Get("format")
	if format != "" && format != "json" && format != "csv" {
		return 0, nil, badField("format", "%q is not json or csv", format)
	}
	b, err := a.ledger.EntitlementBilling(r.Context(), q.Get("period"), q.Get("entitlement"))
	if err == nil && format == "csv" {
		return http.StatusOK, csvBody{b}, nil
	}
	return auditAnswer(b, err)
}

// ledgerBalance answers a balance recomputed from the ledger alone (GET
// /api/v1/ledger/balance?entitlement=…&dimension=…&subject=…), to compare with GetBalance.
func (a *API) ledgerBalance(r *http.Request, _ caller) (int, any, error) {
	if a.ledger == nil {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "ledger: this process has no ClickHouse (--audit-clickhouse-dsn)"}
	}
	q := r.URL.Query()
	b, err := a.ledger.Balance(r.Context(), q.Get("entitlement"), q.Get("dimension"), q.Get("subject"), time.Now())
	return auditAnswer(b, err)
}
