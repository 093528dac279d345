package aggregator

import (
	"testing"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestKindColumn: every kind of event has its name in the audit, a check none.
func TestKindColumn(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		k    quotaflowv1.Kind
		want string
	}{
		{quotaflowv1.Kind_KIND_UNSPECIFIED, ""},
		{quotaflowv1.Kind_KIND_RESERVE, "reserve"},
		{quotaflowv1.Kind_KIND_SETTLE, "settle"},
		{quotaflowv1.Kind_KIND_CANCEL, "cancel"},
		{quotaflowv1.Kind_KIND_LEASE_RELEASE, "lease_release"},
		{quotaflowv1.Kind_KIND_LEASE_EXPIRED, "lease_expired"},
	} {
		if got := kind(tt.k); got != tt.want {
			t.Errorf("kind(%v) = %q, want %q", tt.k, got, tt.want)
		}
	}
}
