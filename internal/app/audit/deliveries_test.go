package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// TestDeliveries: an endpoint's delivery log, the newest first, bounded; another endpoint's
// attempts and those older than a week are not read; a bad endpoint or n is named.
func TestDeliveries(t *testing.T) {
	t.Parallel()
	rd, conn := fixture(t, "deliveries", nil)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	b, err := conn.PrepareBatch(ctx, "INSERT INTO audit_deliveries.webhook_deliveries (at, endpoint, message_id, attempt, status, outcome, error, duration_ms, next_ms)")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		at       time.Time
		endpoint string
		attempt  uint32
		status   uint16
		outcome  string
	}{
		{now.Add(-3 * time.Second), "billing", 1, 503, "retry"},
		{now.Add(-2 * time.Second), "billing", 2, 200, "delivered"},
		{now.Add(-time.Second), "crm", 1, 200, "delivered"},
		{now.Add(-8 * 24 * time.Hour), "billing", 1, 200, "delivered"},
	} {
		if err := b.Append(r.at, r.endpoint, "evt-1", r.attempt, r.status, r.outcome, "", uint32(12), uint64(0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	got, err := rd.Deliveries(ctx, "billing", 0)
	if err != nil || len(got) != 2 || got[0].Outcome != "delivered" || got[0].Attempt != 2 || got[1].Status != 503 || got[0].DurationMs != 12 {
		t.Fatalf("Deliveries(billing) = %+v, %v; want the delivery then the retry", got, err)
	}
	if got, err := rd.Deliveries(ctx, "billing", 1); err != nil || len(got) != 1 {
		t.Errorf("Deliveries(billing, 1) = %+v, %v; want one", got, err)
	}
	for _, tt := range []struct {
		endpoint string
		n        int
		field    string
	}{{"a.b", 0, "endpoint"}, {"", 0, "endpoint"}, {"billing", 501, "n"}} {
		var fe *field.Error
		if _, err := rd.Deliveries(ctx, tt.endpoint, tt.n); !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("Deliveries(%q, %d): %v, want a field error naming %s", tt.endpoint, tt.n, err, tt.field)
		}
	}
}
