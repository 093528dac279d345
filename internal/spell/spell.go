// Package spell writes values as people and the rules file write them, for every output a
// person reads (the CLI's tables, the event lines of quotaflow watch): 1m and 24h, not Go's
// 1m0s and 24h0m0s.
package spell

import (
	"strings"
	"time"
)

// Duration is d as a rules file writes a window: its zero minutes and seconds left out (1m,
// 24h, 1h30m), the rest as time.Duration.String writes it (1h0m1s, 1.5s, 250ms).
func Duration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
		if t, ok := strings.CutSuffix(s, "h0m"); ok {
			s = t + "h"
		}
	}
	return s
}
