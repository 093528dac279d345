package report

import (
	"fmt"
	"time"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Settled is a settled reservation on one line (quotaflow settle): the estimate, what the
// work took, what is left, and whether it was charged past the limit.
func Settled(m *quotaflowv1.SettleResponse) string {
	over := ""
	if m.Overage {
		over = "  OVERAGE (charged past the limit)"
	}
	return fmt.Sprintf("settled: estimate %d, actual %d, %d left%s (decision %s)", m.Estimate, m.Actual, m.Remaining, over, m.DecisionId)
}

// Cancelled is a cancelled reservation on one line (quotaflow settle --cancel).
func Cancelled(m *quotaflowv1.CancelResponse) string {
	return fmt.Sprintf("cancelled: %d refunded, %d left (decision %s)", m.Estimate, m.Remaining, m.DecisionId)
}

// Renewed is a renewed lease on one line (quotaflow release --renew): its new expiry.
func Renewed(m *quotaflowv1.RenewLeaseResponse) string {
	return "renewed until " + time.UnixMilli(m.ExpiresAtMs).UTC().Format(time.RFC3339)
}
