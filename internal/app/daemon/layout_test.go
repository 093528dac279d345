package daemon

import (
	"testing"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// TestBucketLayout: each of the checker's public layout names is the store's layout of that
// name, so that --bucket-layout's every value reaches the checker as its own layout.
func TestBucketLayout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   bucket.Layout
		want checker.BucketLayout
	}{
		{bucket.LayoutPrevious, checker.PreviousBuckets},
		{bucket.LayoutCompact, checker.CompactBuckets},
		{bucket.LayoutShared, checker.SharedBuckets},
		{bucket.LayoutMixed, checker.MixedBuckets},
	} {
		if got := checker.BucketLayout(tt.in); got != tt.want {
			t.Errorf("layout %v = %d, want %d", tt.in, got, tt.want)
		}
	}
}
