package outcomepb

import (
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestDimension: every rules dimension has its own value in quotaflow.v1's enum, and
// RulesDimension brings it back; the unspecified value and unknown ones have none.
func TestDimension(t *testing.T) {
	t.Parallel()
	seen := map[quotaflowv1.Dimension]rules.Dimension{}
	for d := rules.DimensionUser; d.Valid(); d++ {
		pd := Dimension(d)
		if pd == quotaflowv1.Dimension_DIMENSION_UNSPECIFIED {
			t.Errorf("Dimension(%v) is unspecified", d)
		}
		if prev, ok := seen[pd]; ok {
			t.Errorf("Dimension(%v) = Dimension(%v) = %v", d, prev, pd)
		}
		seen[pd] = d
		if back, ok := RulesDimension(pd); !ok || back != d {
			t.Errorf("RulesDimension(%v) = %v, %v; want %v", pd, back, ok, d)
		}
	}
	for _, pd := range []quotaflowv1.Dimension{quotaflowv1.Dimension_DIMENSION_UNSPECIFIED, 99} {
		if d, ok := RulesDimension(pd); ok {
			t.Errorf("RulesDimension(%v) = %v, want none", pd, d)
		}
	}
}
