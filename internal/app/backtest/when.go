package backtest

import (
	"fmt"
	"strings"
	"time"
)

// ParseWhen reads a bound of a backtest's history (Request.From, To): an RFC 3339 time, or a
// duration before now (24h), as quotaflow backtest's --from and --to take them.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration before now cannot be negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-11-27T10:00:00Z) nor a duration before now (24h)", s)
	}
	return t, nil
}

// String is p on one line: how far the replay is (the warm-up, or the share of [From, To)),
// the audit rows read and the time taken.
func (p Progress) String() string {
	at := "warm-up"
	if !p.At.Before(p.From) {
		at = fmt.Sprintf("%3.0f%%", 100*p.Fraction())
	}
	return fmt.Sprintf("%s, %s audit rows, %s", at, strings.TrimSpace(fmt.Sprintf("%9d", p.Records)), p.Elapsed.Round(time.Second))
}
