package audit

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// BillingRequest asks for a subject's checks over one calendar month in a time zone.
type BillingRequest struct {
	Subject string // dimension:identifier, as the audit writes it
	// Month is the period, "2006-01"; empty: the current month in Location.
	Month string
	// Location is the zone whose calendar the period and its days follow (nil: UTC).
	Location *time.Location
}

// Billing is a subject's checks per day of a billing period.
type Billing struct {
	Subject  string    `json:"subject"`
	Month    string    `json:"month"`
	Timezone string    `json:"timezone"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	// Days are the period's days with checks, in order; Total their sum. Cost is the units the
	// allowed checks consumed, what a bill counts.
	Days  []BillingDay `json:"days"`
	Total BillingDay   `json:"total"`
}

// BillingDay is one day's checks ("2006-01-02" in the period's zone).
type BillingDay struct {
	Day  string `json:"day,omitempty"`
	Cost int64  `json:"allowed_cost"`
	Counts
}

// Billing returns the subject's checks per day of the month. Its errors are a *field.Error
// (subject, month) or ClickHouse's.
func (r *Reader) Billing(ctx context.Context, req BillingRequest) (*Billing, error) {
	if err := validSubject(req.Subject); err != nil {
		return nil, field.Errorf("subject", "%v", err)
	}
	loc := req.Location
	if loc == nil {
		loc = time.UTC
	}
	if req.Month == "" {
		req.Month = time.Now().In(loc).Format("2006-01")
	}
	start, err := time.ParseInLocation("2006-01", req.Month, loc)
	if err != nil {
		return nil, field.Errorf("month", "%q is not a month as 2006-01", req.Month)
	}
	end := start.AddDate(0, 1, 0)
	if now := time.Now(); start.After(now) || end.Before(now.Add(-maxRetention)) {
		return nil, field.Errorf("month", "%s is outside the audit's retained history (%d days)", req.Month, int(maxRetention.Hours()/24))
	}
	// Rows are summed per quarter hour and their day taken in Go: every zone's offset is a
	// multiple of 15 minutes, so no quarter spans two days of any calendar, a day of 23 or 25
	// hours is right, and no ClickHouse needs a time zone database (18.16's toDate has no
	// zone argument). A month is at most 2,976 rows.
	q := fmt.Sprintf(`SELECT intDiv(time_us, 900000000) * 900 AS sec, sum(cost * allowed), %s
FROM %s.decisions
WHERE %s AND %s AND has(subjects, ?)
GROUP BY sec
ORDER BY sec`, outcomes, r.db, timeBound(start, end), checks)
	rows, err := r.conn.Query(ctx, q, req.Subject)
	if err != nil {
		return nil, fmt.Errorf("billing period: %w", err)
	}
	defer rows.Close()
	b := &Billing{Subject: req.Subject, Month: req.Month, Timezone: loc.String(), From: start, To: end, Days: []BillingDay{}}
	for rows.Next() {
		var (
			sec  int64
			cost int64
			c    [6]uint64
		)
		if err := rows.Scan(&sec, &cost, &c[0], &c[1], &c[2], &c[3], &c[4], &c[5]); err != nil {
			return nil, fmt.Errorf("billing period: %w", err)
		}
		day := time.Unix(sec, 0).In(loc).Format("2006-01-02")
		if n := len(b.Days); n == 0 || b.Days[n-1].Day != day {
			b.Days = append(b.Days, BillingDay{Day: day})
		}
		d := &b.Days[len(b.Days)-1]
		d.Cost += cost
		d.add(countsOf(c))
		b.Total.Cost += cost
		b.Total.add(countsOf(c))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billing period: %w", err)
	}
	return b, nil
}

// WriteCSV writes the period as CSV: a header, a row per day, and a total row.
func (b *Billing) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"subject", "timezone", "day", "checks", "allowed", "allowed_cost", "denied", "delayed", "degraded", "degraded_denied"})
	row := func(day string, d BillingDay) {
		cw.Write([]string{b.Subject, b.Timezone, day, itoa(d.Checks), itoa(d.Allowed), itoa(d.Cost), itoa(d.Denied),
			itoa(d.Delayed), itoa(d.Degraded), itoa(d.DegradedDenied)})
	}
	for _, d := range b.Days {
		row(d.Day, d)
	}
	row("total "+b.Month, b.Total)
	cw.Flush()
	return cw.Error()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
