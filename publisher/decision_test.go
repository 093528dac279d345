package publisher_test

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/publisher"
)

// TestDecisionKinds: a reserve, a settle, a cancel, a lease's check and its release render as the events
// the stream documents (events.proto: kind and its fields).
func TestDecisionKinds(t *testing.T) {
	t.Parallel()
	sub := []checker.Subject{{Dimension: rules.DimensionUser, ID: "alice"}}
	now := time.Now()
	// The stream keeps ids' digests, never the ids: reading it gives none to present.
	hx, r1x := checker.IDDigest("h.x"), checker.IDDigest("r.1.x")
	if hx == "h.x" || len(hx) != 32 || r1x == hx {
		t.Fatalf("IDDigest = %q, %q; want 32 hex characters, unlike the ids", hx, r1x)
	}
	tests := []struct {
		name string
		q    *checker.Query
		out  *checker.Outcome
		want *quotaflowv1.Decision
	}{
		{"check", &checker.Query{Subjects: sub, Cost: 2}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Lease: &checker.Lease{ID: "h.x"}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_UNSPECIFIED, Cost: 2, LeaseId: hx}},
		{"reserve", &checker.Query{Subjects: sub, Cost: 40, Reserve: time.Minute}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Reservation: &checker.Reservation{ID: "r.1.x", Estimate: 40}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_RESERVE, Cost: 40, EstimatedCost: 40, ReservationId: r1x}},
		{"denied reserve", &checker.Query{Subjects: sub, Cost: 40, Reserve: time.Minute}, &checker.Outcome{Now: now, Decider: -1},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_RESERVE, Cost: 40, EstimatedCost: 40}},
		{"settle", &checker.Query{Subjects: sub, Cost: 90, Endpoint: "/llm"}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Tier: "free",
			Settlement: &checker.Settlement{ReservationID: "r.1.x", Estimate: 40, Actual: 130, Overage: true, Tier: "free", Endpoint: "/llm", RuleID: "tokens"}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_SETTLE, Cost: 90, EstimatedCost: 40, ActualCost: 130, Overage: true, ReservationId: r1x,
				Tier: "free", Endpoint: "/llm", RuleId: "tokens"}},
		{"cancel", &checker.Query{Subjects: sub, Cost: -40}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Settlement: &checker.Settlement{ReservationID: "r.1.x", Estimate: 40, Cancelled: true}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_CANCEL, Cost: -40, EstimatedCost: 40, ReservationId: r1x}},
		{"lease release", &checker.Query{Subjects: sub}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Released: &checker.Released{LeaseID: "h.x"}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_LEASE_RELEASE, LeaseId: hx}},
		{"lease expired", &checker.Query{Subjects: sub}, &checker.Outcome{Allowed: true, Now: now, Decider: -1, Released: &checker.Released{LeaseID: "h.x", Expired: true}},
			&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_LEASE_EXPIRED, LeaseId: hx}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := publisher.Decision("c1", tt.q, tt.out)
			if d.Kind != tt.want.Kind || d.Cost != tt.want.Cost || d.EstimatedCost != tt.want.EstimatedCost || d.ActualCost != tt.want.ActualCost ||
				d.Overage != tt.want.Overage || d.ReservationId != tt.want.ReservationId || d.LeaseId != tt.want.LeaseId {
				t.Errorf("got kind %v cost %d estimate %d actual %d overage %v reservation %q lease %q, want %v",
					d.Kind, d.Cost, d.EstimatedCost, d.ActualCost, d.Overage, d.ReservationId, d.LeaseId, tt.want)
			}
			if tt.want.Tier != "" && (d.Tier != tt.want.Tier || d.Endpoint != tt.want.Endpoint || d.RuleId != tt.want.RuleId) {
				t.Errorf("got tier %q endpoint %q rule %q, want %q %q %q", d.Tier, d.Endpoint, d.RuleId, tt.want.Tier, tt.want.Endpoint, tt.want.RuleId)
			}
		})
	}
}
