// Package outcomepb renders the engine's outcomes in quotaflow.v1's messages: the limit
// statuses that the RPC answers (checker/transport) and the decision stream's events
// (publisher) both carry, written once so that an answer and its event cannot disagree.
package outcomepb

import (
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Statuses renders every evaluated limit of o, in o.Limits' order (o.Decider indexes it too).
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
	return st
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

// Dimension is d in quotaflow.v1's enum.
func Dimension(d rules.Dimension) quotaflowv1.Dimension {
	switch d {
	case rules.DimensionUser:
		return quotaflowv1.Dimension_DIMENSION_USER
	case rules.DimensionIP:
		return quotaflowv1.Dimension_DIMENSION_IP
	case rules.DimensionAPIKey:
		return quotaflowv1.Dimension_DIMENSION_API_KEY
	case rules.DimensionGlobal:
		return quotaflowv1.Dimension_DIMENSION_GLOBAL
	case rules.DimensionOrg:
		return quotaflowv1.Dimension_DIMENSION_ORG
	case rules.DimensionDescriptor:
		return quotaflowv1.Dimension_DIMENSION_DESCRIPTOR
	}
	return quotaflowv1.Dimension_DIMENSION_UNSPECIFIED
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
