package bucket

import (
	"strconv"
	"strings"
	"time"
)

// A balance's thresholds are told by the charge that first finds each true, in the script
// that charges it (lua/balance.lua), so that one crossing is told once however many checkers
// charge the balance at once, and a refunded charge tells nothing.

// ThresholdKind is what a threshold of a balance watches.
type ThresholdKind byte

// The kinds, as lua/balance.lua spells them.
const (
	// UsedPercent: the period's usage reached N % of what it had (usage plus the balance).
	UsedPercent ThresholdKind = 'p'
	// BalanceBelow: the balance fell below N.
	BalanceBelow ThresholdKind = 'b'
	// ExpiringWithin: a live grant with something left expires within N ms.
	ExpiringWithin ThresholdKind = 'e'
)

// Told is one threshold a charge told.
type Told struct {
	Kind ThresholdKind
	N    int64
	// Grant is, for ExpiringWithin, the grant about to expire.
	Grant string
}

// ThresholdSpec writes a balance's thresholds as Limit.Thresholds takes them.
func ThresholdSpec(usedPercent []int, below []int64, within []time.Duration) string {
	var b strings.Builder
	add := func(k ThresholdKind, n int64) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteByte(byte(k))
		b.WriteString(strconv.FormatInt(n, 10))
	}
	for _, p := range usedPercent {
		add(UsedPercent, int64(p))
	}
	for _, n := range below {
		add(BalanceBelow, n)
	}
	for _, d := range within {
		add(ExpiringWithin, d.Milliseconds())
	}
	return b.String()
}

// toldOf is what a balance charge's refund token says it told (its second part).
func toldOf(token string) []Told {
	parts := strings.SplitN(token, "|", 3)
	if len(parts) < 2 {
		return nil
	}
	return parseTold(parts[1])
}

// parseTold reads the thresholds a script told ("p80,b1000,e86400000:<grant>"); a malformed
// entry is skipped, as the script writes none.
func parseTold(s string) []Told {
	if s == "" {
		return nil
	}
	var out []Told
	for _, t := range strings.Split(s, ",") {
		if len(t) < 2 {
			continue
		}
		num, grant, _ := strings.Cut(t[1:], ":")
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, Told{Kind: ThresholdKind(t[0]), N: n, Grant: grant})
	}
	return out
}
