package instance

import (
	"regexp"
	"strings"
	"testing"
)

func TestIDs(t *testing.T) {
	t.Parallel()
	hex12 := regexp.MustCompile(`^[0-9a-f]{12}$`)
	a, b := NewID(), NewID()
	if !hex12.MatchString(a) || a == b {
		t.Errorf("NewID = %q, %q; want two different 12-character hex ids", a, b)
	}
	if got := Named(""); !hex12.MatchString(got) {
		t.Errorf("Named(\"\") = %q, want a NewID", got)
	}
	if got := Named("pod-1"); !strings.HasPrefix(got, "pod-1-") || len(got) != len("pod-1-")+6 {
		t.Errorf("Named(pod-1) = %q, want pod-1- and 6 random characters", got)
	}
}
