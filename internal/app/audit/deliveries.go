package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// Delivery is one attempt to deliver an event to a webhook endpoint, as the aggregators logged
// it (webhook_deliveries).
type Delivery struct {
	At time.Time `json:"at"`
	// MessageID is the event's webhook-id; Attempt its attempt's number, 1 for the first.
	MessageID string `json:"message_id"`
	Attempt   int    `json:"attempt"`
	// Status is the receiver's HTTP status, 0 without an answer; Outcome delivered, retry,
	// gave up or failed; Error why it failed.
	Status     int    `json:"status"`
	Outcome    string `json:"outcome"`
	Error      string `json:"error,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	// NextMs is the wait before the next attempt, 0 without one.
	NextMs int64 `json:"next_ms,omitempty"`
}

// deliverySpan bounds how far back Deliveries looks: the table is partitioned by day.
const deliverySpan = 7 * 24 * time.Hour

// Deliveries returns endpoint's latest attempts of the last week, the newest first, at most n
// (0: 50; at most 500). Its errors are a *field.Error (endpoint, n) or ClickHouse's.
func (r *Reader) Deliveries(ctx context.Context, endpoint string, n int) ([]Delivery, error) {
	if err := (webhook.Endpoint{ID: endpoint}).CheckID(); err != nil {
		return nil, field.Wrap("endpoint", err)
	}
	if n == 0 {
		n = 50
	}
	if n < 1 || n > 500 {
		return nil, field.Errorf("n", "%d is not 1 to 500", n)
	}
	now := time.Now()
	q := fmt.Sprintf(`SELECT at, message_id, attempt, status, outcome, error, duration_ms, next_ms
FROM %s.webhook_deliveries
WHERE endpoint = ? AND at >= toDateTime(%d) AND at <= toDateTime(%d)
ORDER BY at DESC, message_id
LIMIT %d`, r.db, now.Add(-deliverySpan).Unix(), now.Add(time.Second).Unix(), n)
	rows, err := r.conn.Query(ctx, q, endpoint)
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries: %w", err)
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		var (
			d        Delivery
			at       time.Time
			attempt  uint32
			status   uint16
			dur      uint32
			nextWait uint64
		)
		if err := rows.Scan(&at, &d.MessageID, &attempt, &status, &d.Outcome, &d.Error, &dur, &nextWait); err != nil {
			return nil, fmt.Errorf("webhook deliveries: %w", err)
		}
		d.At, d.Attempt, d.Status, d.DurationMs, d.NextMs = at.UTC(), int(attempt), int(status), int64(dur), int64(nextWait)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("webhook deliveries: %w", err)
	}
	return out, nil
}
