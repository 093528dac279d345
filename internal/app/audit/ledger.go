package audit

import (
	"context"
	"database/sql"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// The grant ledger (schema 0013) is every move of every balance, its amount signed: what it
// added to a grant's remainder. A grant's remainder is the sum of its rows; a balance the sum
// of the remainders of its live grants (started, not expired, not voided); a period's usage
// the burns (net of what settles gave back) and overage of the rows of that period. These
// queries are those of docs/queries.md, and run on ClickHouse 18.16 as on current servers.
//
// A decision's moves may be stored twice: once from its checker and once recovered from the
// balance journal (kind recovered, under the same decision id), when the checker was killed or
// its answer lost between Redis and the spool. Each query reads the ledger through
// ledgerOnce, which keeps one copy of each decision's moves.

// ledgerOnce is the ledger's rows where selects, one of each move: DISTINCT over every column
// but the instant, which a recovered copy takes from Redis, and which no query sums.
func ledgerOnce(db, where string) string {
	return `(SELECT DISTINCT entitlement, dimension, subject, kind, grant_id, amount, period_start, period_end,
        effective_ms, expires_ms, source
    FROM ` + db + `.ledger
    WHERE ` + where + `)`
}

// LedgerBalance is a subject's balance of an entitlement recomputed from the ledger.
type LedgerBalance struct {
	Entitlement string `json:"entitlement"`
	Dimension   string `json:"dimension"`
	Subject     string `json:"subject"`
	// At is the instant the balance is of: a grant counts if live then.
	At time.Time `json:"at"`
	// Remaining is the sum of the live grants' remainders; Grants each grant's remainder,
	// live or not.
	Remaining int64            `json:"remaining"`
	Grants    map[string]int64 `json:"grants"`
	// PeriodStart is the latest period the ledger holds moves of; Used and Overage that
	// period's usage, overage included, and overage.
	PeriodStart time.Time `json:"period_start"`
	Used        int64     `json:"used"`
	Overage     int64     `json:"overage"`
}

// Balance recomputes subject's balance of entitlement (holders of dimension) at at from the
// ledger alone. Its errors are a *field.Error or ClickHouse's.
func (r *Reader) Balance(ctx context.Context, entitlement, dimension, subject string, at time.Time) (*LedgerBalance, error) {
	if entitlement == "" || dimension == "" || subject == "" {
		return nil, field.Errorf("entitlement", "entitlement, dimension and subject are required")
	}
	b := &LedgerBalance{Entitlement: entitlement, Dimension: dimension, Subject: subject, At: at.UTC(), Grants: map[string]int64{}}
	ms := at.UnixMilli()
	rows, err := r.conn.Query(ctx, `SELECT grant_id, sum(amount) AS rem, max(effective_ms) AS eff, max(expires_ms) AS exp,
    countIf(kind = 'voided') AS voided
FROM `+ledgerOnce(r.db, `entitlement = ? AND dimension = ? AND subject = ? AND grant_id != ''`)+`
GROUP BY grant_id`, entitlement, dimension, subject)
	if err != nil {
		return nil, fmt.Errorf("ledger balance: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id            string
			rem, eff, exp int64
			voided        uint64
		)
		if err := rows.Scan(&id, &rem, &eff, &exp, &voided); err != nil {
			return nil, fmt.Errorf("ledger balance: %w", err)
		}
		b.Grants[id] = rem
		if voided == 0 && eff <= ms && (exp == 0 || exp > ms) && rem > 0 {
			b.Remaining += rem
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger balance: %w", err)
	}
	row := r.conn.QueryRow(ctx, `SELECT period_start,
    -sumIf(amount, kind IN ('burned', 'given_back', 'overage', 'overage_back')) AS used,
    -sumIf(amount, kind IN ('overage', 'overage_back')) AS overage
FROM `+ledgerOnce(r.db, `entitlement = ? AND dimension = ? AND subject = ? AND period_start = (
        SELECT max(period_start) FROM `+r.db+`.ledger WHERE entitlement = ? AND dimension = ? AND subject = ?)`)+`
GROUP BY period_start`, entitlement, dimension, subject, entitlement, dimension, subject)
	if err := row.Scan(&b.PeriodStart, &b.Used, &b.Overage); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("ledger usage: %w", err)
	}
	b.PeriodStart = b.PeriodStart.UTC()
	return b, nil
}

// BillingPeriod is the billing export of one month: per entitlement, holder and balance
// period that started in it, what was granted, used and forfeited.
type BillingPeriod struct {
	Period string        `json:"period"`
	From   time.Time     `json:"from"`
	To     time.Time     `json:"to"`
	Rows   []BillingLine `json:"rows"`
}

// BillingLine is one holder's balance period of one entitlement.
type BillingLine struct {
	Entitlement string    `json:"entitlement"`
	Dimension   string    `json:"dimension"`
	Subject     string    `json:"subject"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	// Granted is what grants brought in the period (issued, issued again, rolled over); Used
	// what was used, overage included; Overage what was used past a zero balance; Forfeited
	// what expired or was voided unused.
	Granted   int64 `json:"granted"`
	Used      int64 `json:"used"`
	Overage   int64 `json:"overage"`
	Forfeited int64 `json:"forfeited"`
}

// EntitlementBilling returns the billing export of the month period ("2006-01", UTC; empty:
// this month): every balance period that started in it, for entitlement (all when empty).
// Its errors are a *field.Error (period) or ClickHouse's.
func (r *Reader) EntitlementBilling(ctx context.Context, period, entitlement string) (*BillingPeriod, error) {
	if period == "" {
		period = time.Now().UTC().Format("2006-01")
	}
	from, err := time.Parse("2006-01", period)
	if err != nil {
		return nil, field.Errorf("period", "%q is not a month as 2006-01", period)
	}
	to := from.AddDate(0, 1, 0)
	rows, err := r.conn.Query(ctx, fmt.Sprintf(`SELECT entitlement, dimension, subject, period_start, max(period_end) AS period_end,
    sumIf(amount, kind IN ('issued', 'reissued', 'rolled_over')) AS granted,
    -sumIf(amount, kind IN ('burned', 'given_back', 'overage', 'overage_back')) AS used,
    -sumIf(amount, kind IN ('overage', 'overage_back')) AS overage,
    -sumIf(amount, kind IN ('forfeited', 'voided')) AS forfeited
FROM %s
GROUP BY entitlement, dimension, subject, period_start
ORDER BY entitlement, dimension, subject, period_start`, ledgerOnce(r.db, fmt.Sprintf(`period_start >= toDateTime(%d) AND period_start < toDateTime(%d) AND (? = '' OR entitlement = ?)`, from.Unix(), to.Unix()))), entitlement, entitlement)
	if err != nil {
		return nil, fmt.Errorf("billing export: %w", err)
	}
	defer rows.Close()
	out := &BillingPeriod{Period: period, From: from, To: to, Rows: []BillingLine{}}
	for rows.Next() {
		var l BillingLine
		if err := rows.Scan(&l.Entitlement, &l.Dimension, &l.Subject, &l.PeriodStart, &l.PeriodEnd, &l.Granted, &l.Used, &l.Overage, &l.Forfeited); err != nil {
			return nil, fmt.Errorf("billing export: %w", err)
		}
		l.PeriodStart, l.PeriodEnd = l.PeriodStart.UTC(), l.PeriodEnd.UTC()
		out.Rows = append(out.Rows, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billing export: %w", err)
	}
	return out, nil
}

// WriteCSV writes the export as CSV: a header, then a row per holder's balance period.
func (b *BillingPeriod) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"entitlement", "dimension", "subject", "period_start", "period_end", "granted", "used", "overage", "forfeited"})
	for _, l := range b.Rows {
		cw.Write([]string{l.Entitlement, l.Dimension, l.Subject, l.PeriodStart.Format(time.RFC3339), l.PeriodEnd.Format(time.RFC3339),
			itoa(l.Granted), itoa(l.Used), itoa(l.Overage), itoa(l.Forfeited)})
	}
	cw.Flush()
	return cw.Error()
}
