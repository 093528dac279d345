package audit

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// SeriesRequest asks for checks by outcome per tier or rule over the Span before To.
type SeriesRequest struct {
	// By is "tier" or "rule": what each series is of.
	By string
	// Span is how far back from To (0: an hour; at most MaxSpan). Up to 6 hours are read per
	// minute, up to 7 days per hour, longer spans per day: the rollups kept that long.
	Span time.Duration
	// To ends the span (zero: now).
	To time.Time
}

// MaxSpan is the longest series: the day rollup is kept a year.
const MaxSpan = 366 * 24 * time.Hour

// Series is one SeriesRequest's answer.
type Series struct {
	By   string    `json:"by"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Step is the rollup's bucket: a minute, an hour or a day.
	Step time.Duration `json:"step_ns"`
	// Keys are the tiers or rules with checks, the busiest first.
	Keys []string `json:"keys"`
	// Points are each key's buckets with checks, in time order.
	Points []Point `json:"points"`
	// Totals are each key's sums over the span.
	Totals map[string]Counts `json:"totals"`
}

// Point is one key's checks in one bucket.
type Point struct {
	At  time.Time `json:"at"`
	Key string    `json:"key"`
	Counts
}

// rollupOf picks the rollup that covers span with the finest step.
func rollupOf(span time.Duration) (table, column string, step time.Duration) {
	switch {
	case span <= 6*time.Hour:
		return "usage_minute", "toUInt32(minute)", time.Minute
	case span <= 7*24*time.Hour:
		return "usage_hour", "toUInt32(hour)", time.Hour
	}
	return "usage_day", "toUInt32(toDateTime(day))", 24 * time.Hour
}

// Series returns checks by outcome per bucket of req's span. Its errors are a *field.Error
// (by, span) or ClickHouse's.
func (r *Reader) Series(ctx context.Context, req SeriesRequest) (*Series, error) {
	key := map[string]string{"tier": "tier", "rule": "rule_id"}[req.By]
	if key == "" {
		return nil, field.Errorf("by", "%q is not tier or rule", req.By)
	}
	if req.Span == 0 {
		req.Span = time.Hour
	}
	if req.Span < time.Minute || req.Span > MaxSpan {
		return nil, field.Errorf("span", "%s is not 1m to %s", req.Span, MaxSpan)
	}
	if req.To.IsZero() {
		req.To = time.Now()
	}
	table, at, step := rollupOf(req.Span)
	from := req.To.Add(-req.Span).Truncate(step)
	q := fmt.Sprintf(`SELECT %s AS at, %s AS key, sum(requests), sum(allowed_requests),
    toUInt64(sum(denied_requests) - sum(degraded_denied)), sum(delayed_requests), sum(degraded_requests), sum(degraded_denied)
FROM %s.%s
WHERE %s >= %d AND %s <= %d
GROUP BY at, key
ORDER BY at, key`, at, key, r.db, table, at, from.Unix(), at, req.To.Unix())
	rows, err := r.conn.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("usage series: %w", err)
	}
	defer rows.Close()
	s := &Series{By: req.By, From: from.UTC(), To: req.To.UTC(), Step: step, Keys: []string{}, Points: []Point{}, Totals: map[string]Counts{}}
	for rows.Next() {
		var (
			unix uint32
			p    Point
			c    [6]uint64
		)
		if err := rows.Scan(&unix, &p.Key, &c[0], &c[1], &c[2], &c[3], &c[4], &c[5]); err != nil {
			return nil, fmt.Errorf("usage series: %w", err)
		}
		p.At = time.Unix(int64(unix), 0).UTC()
		p.Counts = Counts{Checks: int64(c[0]), Allowed: int64(c[1]), Denied: int64(c[2]), Delayed: int64(c[3]),
			Degraded: int64(c[4]), DegradedDenied: int64(c[5])}
		s.Points = append(s.Points, p)
		t := s.Totals[p.Key]
		t.add(p.Counts)
		s.Totals[p.Key] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("usage series: %w", err)
	}
	for k := range s.Totals {
		s.Keys = append(s.Keys, k)
	}
	sort.Slice(s.Keys, func(i, j int) bool {
		a, b := s.Totals[s.Keys[i]].Checks, s.Totals[s.Keys[j]].Checks
		return a > b || a == b && s.Keys[i] < s.Keys[j]
	})
	return s, nil
}

func (c *Counts) add(o Counts) {
	c.Checks += o.Checks
	c.Allowed += o.Allowed
	c.Denied += o.Denied
	c.Delayed += o.Delayed
	c.Degraded += o.Degraded
	c.DegradedDenied += o.DegradedDenied
}
