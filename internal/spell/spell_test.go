package spell

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{time.Minute, "1m"}, {24 * time.Hour, "24h"}, {90 * time.Minute, "1h30m"}, {10 * time.Second, "10s"},
		{1500 * time.Millisecond, "1.5s"}, {0, "0s"}, {time.Hour + time.Second, "1h0m1s"}, {250 * time.Millisecond, "250ms"},
		{3599867 * time.Millisecond, "59m59.867s"}, {-time.Minute, "-1m"},
	} {
		if got := Duration(tt.d); got != tt.want {
			t.Errorf("Duration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}
