// Package outcomepb renders the engine's outcomes in quotaflow.v1's messages: the limit
// statuses that the RPC answers (checker/transport) and the decision stream's events
// (publisher) both carry, written once so that an answer and its event cannot disagree.
package outcomepb

import (
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Statuses renders every evaluated limit of o, in o.Limits' order (o.Decider indexes it too).
//
// A consuming check renders them twice, once for its event (publisher.Decision, inside the
// engine's Check) and once for its answer (the transport, after Check returns), and that stays:
// the engine hands the decision to its sink before it returns, speaks no protobuf
// (checker.TestAPISpeaksOwnTypes), and a DurableSink holds the check until the event is in its
// spool, so the event cannot wait for the answer's rendering; and the event's messages belong
// to the publisher, which marshals them later on its own goroutine, while the answer's are
// marshalled by the RPC stack: one slice shared by both would tie the two lifetimes together
// for about a microsecond per limit (BenchmarkCheckRPC).
func Statuses(o *checker.Outcome) []*quotaflowv1.LimitStatus {
	if len(o.Limits) == 0 {
		return nil
	}
	out := make([]*quotaflowv1.LimitStatus, len(o.Limits))
	for i := range o.Limits {
		out[i] = Status(&o.Limits[i])
	}
	return out
}

// Status renders one evaluated limit.
func Status(l *checker.LimitOutcome) *quotaflowv1.LimitStatus {
	st := &quotaflowv1.LimitStatus{
		RuleId:       l.Rule.ID,
		Dimension:    Dimension(l.Subject.Dimension),
		Identifier:   l.Subject.ID,
		Endpoint:     l.Rule.Endpoint,
		Algorithm:    l.Rule.Algorithm.String(),
		Limit:        l.Limit.Limit,
		Burst:        l.Limit.Capacity(),
		WindowMs:     l.Limit.Window.Milliseconds(),
		Allowed:      l.Result.Allowed,
		CurrentCount: l.Result.Used,
		Remaining:    l.Result.Remaining,
		ResetAt:      ceilUnix(l.Result.ResetAt),
		RetryAfterMs: ratelimitheader.CeilMillis(l.Result.RetryAfter),
		Shadow:       l.Rule.Shadow,
		CandidateOf:  l.Rule.CandidateOf,
		DelayUs:      CeilMicros(l.Result.Delay),
		State:        State(l.State()),
		Degraded:     l.Degraded,
	}
	if l.Degraded {
		st.FailMode = l.Rule.FailMode.String()
	}
	for _, t := range l.Result.Told() {
		st.Told = append(st.Told, &quotaflowv1.ThresholdCrossing{Kind: ThresholdKind(t.Kind), Threshold: t.N, GrantId: t.Grant})
	}
	if moves := l.Result.Moves(); len(moves) > 0 {
		start, end := periodOf(l.Limit, l.Result.ResetAt)
		for _, m := range moves {
			kind, sign := moveKind(m.Kind)
			st.Ledger = append(st.Ledger, &quotaflowv1.LedgerEntry{Kind: kind, GrantId: m.Grant, Amount: sign * m.N,
				PeriodStart: start, PeriodEnd: end})
		}
	}
	return st
}

// periodOf is the period of a balance's limit that ends at end (its result's ResetAt), unix
// seconds: the first of the limit's two periods, or the second.
func periodOf(l *checker.Limit, end time.Time) (int64, int64) {
	sp := l.Periods
	first := sp.Start.Add(sp.First)
	if end.After(first) {
		return first.Unix(), ceilUnix(end)
	}
	return sp.Start.Unix(), ceilUnix(end)
}

// moveKind names a balance's move as ledger entries do, and the sign of its amount.
func moveKind(k bucket.MoveKind) (string, int64) {
	switch k {
	case bucket.Burned:
		return "burned", -1
	case bucket.Overage:
		return "overage", -1
	case bucket.GivenBack:
		return "given_back", 1
	case bucket.OverageBack:
		return "overage_back", 1
	case bucket.Forfeited:
		return "forfeited", -1
	case bucket.Reissued:
		return "reissued", 1
	case bucket.RolledOver:
		return "rolled_over", 1
	}
	return "unknown", 0
}

// The names of a balance's threshold kinds, as entitlement events and the rules document
// (used_percent, balance_below, expiring_within) spell them.
const (
	KindUsedPercent   = "used_percent"
	KindBalanceBelow  = "balance_below"
	KindGrantExpiring = "grant_expiring"
)

// ThresholdKind names k.
func ThresholdKind(k bucket.ThresholdKind) string {
	switch k {
	case bucket.UsedPercent:
		return KindUsedPercent
	case bucket.BalanceBelow:
		return KindBalanceBelow
	case bucket.ExpiringWithin:
		return KindGrantExpiring
	}
	return "unknown"
}

// Deciding returns the status of o's deciding limit among statuses (Statuses(o)), or nil when
// no rule matched.
func Deciding(o *checker.Outcome, statuses []*quotaflowv1.LimitStatus) *quotaflowv1.LimitStatus {
	if o.Decider < 0 {
		return nil
	}
	return statuses[o.Decider]
}

// State is s in quotaflow.v1's enum.
func State(s checker.State) quotaflowv1.State {
	switch s {
	case checker.StateNormal:
		return quotaflowv1.State_STATE_NORMAL
	case checker.StateWarning:
		return quotaflowv1.State_STATE_WARNING
	case checker.StateThrottled:
		return quotaflowv1.State_STATE_THROTTLED
	}
	return quotaflowv1.State_STATE_UNSPECIFIED
}

// dimensions is the one table of the rules' dimensions in quotaflow.v1's enum, indexed by
// rules.Dimension: Dimension reads it, RulesDimension its inverse.
var dimensions = [...]quotaflowv1.Dimension{
	rules.DimensionUser:       quotaflowv1.Dimension_DIMENSION_USER,
	rules.DimensionIP:         quotaflowv1.Dimension_DIMENSION_IP,
	rules.DimensionAPIKey:     quotaflowv1.Dimension_DIMENSION_API_KEY,
	rules.DimensionGlobal:     quotaflowv1.Dimension_DIMENSION_GLOBAL,
	rules.DimensionOrg:        quotaflowv1.Dimension_DIMENSION_ORG,
	rules.DimensionDescriptor: quotaflowv1.Dimension_DIMENSION_DESCRIPTOR,
}

// Dimension is d in quotaflow.v1's enum, DIMENSION_UNSPECIFIED for none.
func Dimension(d rules.Dimension) quotaflowv1.Dimension {
	if int(d) < len(dimensions) {
		return dimensions[d]
	}
	return quotaflowv1.Dimension_DIMENSION_UNSPECIFIED
}

// RulesDimension is the rules' dimension of d, false for DIMENSION_UNSPECIFIED and values the
// rules do not know.
func RulesDimension(d quotaflowv1.Dimension) (rules.Dimension, bool) {
	for rd, pd := range dimensions {
		if pd == d && d != quotaflowv1.Dimension_DIMENSION_UNSPECIFIED {
			return rules.Dimension(rd), true
		}
	}
	return 0, false
}

// ceilUnix is t in whole unix seconds, rounded up: a reset is never reported earlier than it is.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// CeilMicros is d in whole µs, rounded up: a wait is never reported shorter than it is.
func CeilMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
