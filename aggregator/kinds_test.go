package aggregator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestKindsStored: a reserve (of an exempt check), its settle and a lease's release reach the
// audit with their kinds and fields, and the rollups count the reserve as the one request, at its settled cost.
func TestKindsStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, stop := e.startWith(e.config("kinds"))
	defer stop()
	n := 0
	e.publishEdited(3, 3, func(d *quotaflowv1.Decision) {
		n++
		d.Allowed = true
		switch n {
		case 1:
			d.Kind, d.Cost, d.EstimatedCost, d.ReservationId, d.LeaseId = quotaflowv1.Kind_KIND_RESERVE, 40, 40, "r1", "h.1"
		case 2:
			d.Kind, d.Cost, d.EstimatedCost, d.ActualCost, d.ReservationId, d.Overage = quotaflowv1.Kind_KIND_SETTLE, -30, 40, 10, "r1", false
			d.Limits, d.RuleId = nil, ""
		case 3:
			d.Kind, d.Cost, d.LeaseId = quotaflowv1.Kind_KIND_LEASE_RELEASE, 0, "h.1"
			d.Limits, d.RuleId = nil, ""
		}
		if n == 1 {
			d.Exemption = "office" // an exempt check's flag (migration 0008)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for e.count("SELECT count() FROM %s.decisions") != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the three events not stored within 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rows, err := e.ch.Query(context.Background(), fmt.Sprintf("SELECT kind, reservation_id, estimated_cost, actual_cost, lease_id, cost, exemption FROM %s.decisions ORDER BY time_us, id", e.db))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var kind, rid, lease, exemption string
		var est, act, cost int64
		if err := rows.Scan(&kind, &rid, &est, &act, &lease, &cost, &exemption); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %d %d %s %d %s", kind, rid, est, act, lease, cost, exemption))
	}
	rows.Close()
	want := fmt.Sprint([]string{"reserve r1 40 0 h.1 40 office", "settle r1 40 10  -30 ", "lease_release  0 0 h.1 0 "})
	if fmt.Sprint(got) != want {
		t.Errorf("audit rows %q, want %s", got, want)
	}
	for q, want := range map[string]uint64{
		"SELECT sum(requests) FROM %s.usage_minute":                                 1,
		"SELECT toUInt64(sum(cost_total)) FROM %s.usage_hour":                       10,
		"SELECT toUInt64(sum(reserved_cost)) FROM %s.usage_day":                     40,
		"SELECT toUInt64(sum(reserved_cost) + sum(settle_delta)) FROM %s.usage_day": 10,
		"SELECT sum(settles) FROM %s.usage_minute":                                  1,
		"SELECT sum(leases_acquired) FROM %s.usage_minute":                          1,
		"SELECT sum(leases_released) FROM %s.usage_minute":                          1,
	} {
		// The views write the rollups within the insert, after its decisions are visible.
		var got uint64
		poll.Until(t, time.Minute, fmt.Sprintf("%s = %d", fmt.Sprintf(q, e.db), want), poll.True(func() bool {
			return e.ch.QueryRow(context.Background(), fmt.Sprintf(q, e.db)).Scan(&got) == nil && got == want
		}))
	}
}
