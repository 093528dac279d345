package report

import (
	"fmt"
	"strings"
	"time"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/schema"
)

// settled is a settled reservation on one line (quotaflow settle): the estimate, what the
// work took, what is left, and whether it was charged past the limit.
func settled(m *quotaflowv1.SettleResponse) string {
	over := ""
	if m.Overage {
		over = "  OVERAGE (charged past the limit)"
	}
	return fmt.Sprintf("settled: estimate %d, actual %d, %d left%s (decision %s)", m.Estimate, m.Actual, m.Remaining, over, m.DecisionId)
}

// cancelled is a cancelled reservation on one line (quotaflow settle --cancel).
func cancelled(m *quotaflowv1.CancelResponse) string {
	return fmt.Sprintf("cancelled: %d refunded, %d left (decision %s)", m.Estimate, m.Remaining, m.DecisionId)
}

// renewed is a renewed lease on one line (quotaflow release --renew): its new expiry.
func renewed(m *quotaflowv1.RenewLeaseResponse) string {
	return "renewed until " + time.UnixMilli(m.ExpiresAtMs).UTC().Format(time.RFC3339)
}

// Migrated is what quotaflow migrate did, on one line: the server and its dialect, the
// database (and cluster, when the schema is laid out on one) and the migrations applied.
func Migrated(d schema.Dialect, db, cluster string, applied []string) string {
	where := "database " + db
	if cluster != "" {
		where += " on cluster " + cluster
	}
	line := fmt.Sprintf("clickhouse %s (%s dialect), %s: applied %d migration(s)", d.Version, d, where, len(applied))
	if len(applied) > 0 {
		line += ": " + strings.Join(applied, ", ")
	}
	return line
}
