package aggregator

import (
	"testing"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestAlgorithmColumn: a settle or cancel is audited under its operation's name, every other
// event under its deciding limit's algorithm.
func TestAlgorithmColumn(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    *quotaflowv1.Decision
		want string
	}{
		{&quotaflowv1.Decision{Algorithm: "gcra"}, "gcra"},
		{&quotaflowv1.Decision{Algorithm: "fixed_window", Kind: quotaflowv1.Kind_KIND_RESERVE}, "fixed_window"},
		{&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_SETTLE}, "settle"},
		{&quotaflowv1.Decision{Kind: quotaflowv1.Kind_KIND_CANCEL}, "cancel"},
	} {
		if got := algorithm(tt.d); got != tt.want {
			t.Errorf("algorithm(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
