package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// TopRequest asks for the subjects denied most over the Span before To.
type TopRequest struct {
	Span time.Duration // 0: an hour; at most the audit's retention
	To   time.Time     // zero: now
	N    int           // 0: 10; at most 100
	// Tier and Rule, when set, keep only the checks of that tier or decided by that rule.
	Tier, Rule string
}

// SubjectRow is one subject's checks.
type SubjectRow struct {
	Subject string `json:"subject"` // dimension:identifier, as the audit writes it
	Tier    string `json:"tier"`
	Counts
}

// maxRetention is the audit's retention: no span reaches further back.
const maxRetention = 90 * 24 * time.Hour

// Top returns the subjects whose checks were denied most by their limits (fail-mode denials
// apart), with their tier. Its errors are a *field.Error (span, n) or ClickHouse's.
func (r *Reader) Top(ctx context.Context, req TopRequest) ([]SubjectRow, error) {
	if req.Span == 0 {
		req.Span = time.Hour
	}
	if req.Span < time.Minute || req.Span > maxRetention {
		return nil, field.Errorf("span", "%s is not 1m to %s (the audit's retention)", req.Span, maxRetention)
	}
	if req.N == 0 {
		req.N = 10
	}
	if req.N < 1 || req.N > 100 {
		return nil, field.Errorf("n", "%d is not 1 to 100", req.N)
	}
	if req.To.IsZero() {
		req.To = time.Now()
	}
	q := fmt.Sprintf(`SELECT concat(subject_dimension, ':', subject_id) AS subject, any(tier), %s
FROM %s.decisions
WHERE %s AND %s AND (? = '' OR tier = ?) AND (? = '' OR rule_id = ?)
GROUP BY subject
HAVING denied_n > 0
ORDER BY denied_n DESC, subject
LIMIT %d`, outcomes, r.db, timeBound(req.To.Add(-req.Span), req.To), checks, req.N)
	rows, err := r.conn.Query(ctx, q, req.Tier, req.Tier, req.Rule, req.Rule)
	if err != nil {
		return nil, fmt.Errorf("top subjects: %w", err)
	}
	defer rows.Close()
	out := []SubjectRow{}
	for rows.Next() {
		var s SubjectRow
		var c [6]uint64
		if err := rows.Scan(&s.Subject, &s.Tier, &c[0], &c[1], &c[2], &c[3], &c[4], &c[5]); err != nil {
			return nil, fmt.Errorf("top subjects: %w", err)
		}
		s.Counts = countsOf(c)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("top subjects: %w", err)
	}
	return out, nil
}

// countsOf reads the outcomes columns.
func countsOf(c [6]uint64) Counts {
	return Counts{Checks: int64(c[0]), Allowed: int64(c[1]), Denied: int64(c[2]), Delayed: int64(c[3]),
		Degraded: int64(c[4]), DegradedDenied: int64(c[5])}
}

// Decision is one recorded check of a subject.
type Decision struct {
	At       time.Time `json:"at"`
	Endpoint string    `json:"endpoint"`
	Tier     string    `json:"tier"`
	Rule     string    `json:"rule"`
	Cost     int64     `json:"cost"`
	Allowed  bool      `json:"allowed"`
	Degraded bool      `json:"degraded"`
	// Limit and Remaining are the deciding limit's, as answered.
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	DelayMs   int64 `json:"delay_ms"`
}

// recentSpan bounds how far back Recent looks: the audit is partitioned by day, and a
// subject's latest checks are what a person looking at it wants.
const recentSpan = 24 * time.Hour

// Recent returns the subject's latest checks of the last day, the newest first, at most n
// (0: 50; at most 500). Its errors are a *field.Error (subject, n) or ClickHouse's.
func (r *Reader) Recent(ctx context.Context, subject string, n int) ([]Decision, error) {
	if err := validSubject(subject); err != nil {
		return nil, field.Errorf("subject", "%v", err)
	}
	if n == 0 {
		n = 50
	}
	if n < 1 || n > 500 {
		return nil, field.Errorf("n", "%d is not 1 to 500", n)
	}
	now := time.Now()
	q := fmt.Sprintf(`SELECT time_us, endpoint, tier, rule_id, cost, allowed, degraded, limit_value, remaining, delay_us
FROM %s.decisions
WHERE %s AND %s AND has(subjects, ?)
ORDER BY time_us DESC
LIMIT %d`, r.db, timeBound(now.Add(-recentSpan), now.Add(time.Second)), checks, n)
	rows, err := r.conn.Query(ctx, q, subject)
	if err != nil {
		return nil, fmt.Errorf("recent decisions: %w", err)
	}
	defer rows.Close()
	out := []Decision{}
	for rows.Next() {
		var (
			d                 Decision
			us, delay         int64
			allowed, degraded uint8
		)
		if err := rows.Scan(&us, &d.Endpoint, &d.Tier, &d.Rule, &d.Cost, &allowed, &degraded, &d.Limit, &d.Remaining, &delay); err != nil {
			return nil, fmt.Errorf("recent decisions: %w", err)
		}
		d.At, d.Allowed, d.Degraded, d.DelayMs = time.UnixMicro(us).UTC(), allowed == 1, degraded == 1, delay/1000
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent decisions: %w", err)
	}
	return out, nil
}
