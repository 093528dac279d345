package stream

import (
	"testing"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestDimensionName: the audit's and the events' names of the dimensions, as the ClickHouse
// rows and the warning events have always written them, and their inverse.
func TestDimensionName(t *testing.T) {
	t.Parallel()
	for d, want := range map[quotaflowv1.Dimension]string{
		quotaflowv1.Dimension_DIMENSION_UNSPECIFIED: "unspecified",
		quotaflowv1.Dimension_DIMENSION_USER:        "user",
		quotaflowv1.Dimension_DIMENSION_IP:          "ip",
		quotaflowv1.Dimension_DIMENSION_API_KEY:     "api_key",
		quotaflowv1.Dimension_DIMENSION_GLOBAL:      "global",
		quotaflowv1.Dimension_DIMENSION_ORG:         "org",
		quotaflowv1.Dimension_DIMENSION_DESCRIPTOR:  "descriptor",
		quotaflowv1.Dimension(99):                   "unspecified",
	} {
		if got := DimensionName(d); got != want {
			t.Errorf("DimensionName(%v) = %q, want %q", d, got, want)
		}
		back, ok := ParseDimensionName(want)
		if wantOK := want != "unspecified"; ok != wantOK || ok && back != d {
			t.Errorf("ParseDimensionName(%q) = %v, %v; want %v, %v", want, back, ok, d, wantOK)
		}
	}
}
