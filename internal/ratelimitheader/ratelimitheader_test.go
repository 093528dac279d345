package ratelimitheader

import (
	"testing"
	"time"
)

func TestLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name             string
		policy           string
		remaining, reset int64
		want             string
	}{
		{"plain", "user-api", 7, 30, `"user-api";r=7;t=30`},
		{"never below zero", "p", -3, -1, `"p";r=0;t=0`},
		{"escaped", `a"b\c`, 1, 1, `"a\"b\\c";r=1;t=1`},
		{"non-ASCII", "café", 1, 1, `"caf??";r=1;t=1`},
		{"outside printable ASCII", "tab\there-é", 1, 1, `"tab?here-??";r=1;t=1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Limit(tt.policy, tt.remaining, tt.reset); got != tt.want {
				t.Errorf("Limit(%q, %d, %d) = %s, want %s", tt.policy, tt.remaining, tt.reset, got, tt.want)
			}
		})
	}
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	var p Policies
	if got := p.String(); got != "" {
		t.Errorf("no policy: %q, want empty", got)
	}
	p.Add("user-api", 100, time.Minute, 100)
	p.Add("burst", 10, 500*time.Millisecond, 4)
	p.Add("day", 1000, 24*time.Hour, 0)
	if got, want := p.String(), `"user-api";q=100;w=60, "burst";q=10;w=1;burst=4, "day";q=1000;w=86400`; got != want {
		t.Errorf("policies = %s, want %s", got, want)
	}
}

func TestCeil(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		ms   int64
		secs int64
	}{
		{0, 0, 0}, {time.Nanosecond, 1, 1}, {time.Millisecond, 1, 1}, {999 * time.Millisecond, 999, 1},
		{time.Second, 1000, 1}, {time.Second + time.Nanosecond, 1001, 2},
	} {
		if got := CeilMillis(tt.d); got != tt.ms {
			t.Errorf("CeilMillis(%v) = %d, want %d", tt.d, got, tt.ms)
		}
		if got := CeilSeconds(tt.ms); got != tt.secs {
			t.Errorf("CeilSeconds(%d) = %d, want %d", tt.ms, got, tt.secs)
		}
	}
}
