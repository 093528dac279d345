package checker

import (
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// Outcome is one decided check: what every transport renders, each in its own wire format.
type Outcome struct {
	// Allowed is the answer: no enforced limit denied.
	Allowed bool
	// Replayed reports the first decision of an idempotency key, replayed uncharged.
	Replayed bool
	// Degraded reports that the store could not answer and fail modes decided.
	Degraded bool
	// Now is the store's clock at the decision.
	Now time.Time
	// Tier is the tier the check was decided under.
	Tier string
	// ID is the decision's id ("<instance>-<sequence>"); empty for a peek.
	ID string
	// Limits are the evaluated limits: every matching rule of every subject, or, when the
	// over-limit cache answered, only the cached denials.
	Limits []LimitOutcome
	// Delay is, for an allowed check, how long the caller must wait before going on: the
	// longest delay of its enforced limits that delay instead of denying (rules.Rule.MaxDelay).
	// The check is charged at that slot; 0 for most checks, and for every denied one.
	Delay time.Duration
	// Decider is the index in Limits of the deciding limit: the denying one with the longest
	// wait, or when allowed the one with the largest share of its capacity used; -1 when no
	// rule matched.
	Decider int
	// Exemption is the id of the exemption that let the check past one or more matching rules
	// (rules.Exemption): the check was decided by the others; empty for none.
	Exemption string
	// Lease is, for an allowed check of concurrency rules, the places it holds in flight until
	// Engine.Release; nil otherwise (a peek, a denial, a replay, a fail mode's decision).
	Lease *Lease
	// Reservation is, for an allowed check with Query.Reserve, the charge kept for its settle;
	// nil otherwise (a denial, a fail mode's decision, no limit to settle).
	Reservation *Reservation
	// Settlement is set, alone, on the outcome a settle or cancel publishes (Engine.Settle):
	// the DecisionSink renders it as that event.
	Settlement *Settlement
	// Released is set, alone, on the outcome a lease's release publishes (Engine.Release), or
	// a release or renewal that found the lease expired.
	Released *Released
	// Recovered marks the outcome the balance journal's sweeper publishes for a decision that
	// may be lost (journal.go): under that decision's id, it reports only a balance's moves
	// and the thresholds its charge told, and counts as no request.
	Recovered bool
}

// LimitOutcome is one rule applied to one subject.
type LimitOutcome struct {
	Rule    *rules.Rule
	Subject Subject
	// Limit is the effective limit, overrides and custom limits applied: the bucket limit the
	// store was sent, shared with the check's plan.
	Limit    *Limit
	Result   LimitResult
	Degraded bool // decided by the rule's fail mode

	thresholds rules.Thresholds // the rule's warning thresholds, as the aggregator applies them
}

// Limit is a rule's limit as a check applies it, the bucket limit the store enforces: the rule's
// own or the user's custom limit, overrides applied (bucketLimit). Its Capacity is the most a
// single check may consume.
type Limit = bucket.Limit

// LimitResult is a bucket's state after a check (or a peek) of one limit: the store's own
// result, which the engine hands on as it is.
type LimitResult = bucket.LimitResult

// State is the limit's warning state as this answer sees it: throttled when it denied, warning
// when its use is past the rule's warning threshold (rules.Thresholds.Enters, the test the
// aggregator's events apply), else normal. An answer knows no history, so it cannot apply the
// events' hysteresis: a subject back below the threshold but above the rule's exit ratio is
// still in warning in the event stream and normal here.
func (l *LimitOutcome) State() State {
	return limitState(l.Result, l.Limit.Limit, l.thresholds)
}

// limitState is the warning state of a bucket's result against its limit per window: the one
// rule for a check's limits and a user's listed ones (RuleUsage.State), so that both views of
// one bucket name the same state.
func limitState(res LimitResult, limit int64, t rules.Thresholds) State {
	switch {
	case !res.Allowed:
		return StateThrottled
	case t.Enters(res.Used, limit):
		return StateWarning
	}
	return StateNormal
}

// State is a limit's warning state, as the aggregator's warning events name it.
type State uint8

// The states.
const (
	StateNormal    State = iota // below the rule's warning threshold
	StateWarning                // past it, still allowed
	StateThrottled              // denied
)

var stateNames = [...]string{StateNormal: "normal", StateWarning: "warning", StateThrottled: "throttled"}

// String returns the state's name: "normal", "warning" or "throttled".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// DecidingLimit returns the deciding limit, or nil when no rule matched.
func (o *Outcome) DecidingLimit() *LimitOutcome {
	if o.Decider < 0 {
		return nil
	}
	return &o.Limits[o.Decider]
}

// summarize derives the overall answer: allowed when no enforced limit denied; the deciding
// limit is the denying one with the longest wait, or when allowed the one with the largest
// share of its capacity used.
func (o *Outcome) summarize() {
	o.Allowed = true
	bestShare := -1.0
	for i := range o.Limits {
		l := &o.Limits[i]
		if l.Degraded {
			o.Degraded = true
		}
		if l.Rule.Shadow {
			continue
		}
		if !l.Result.Allowed {
			if o.Allowed || l.Result.RetryAfter > o.Limits[o.Decider].Result.RetryAfter {
				o.Decider = i
			}
			o.Allowed = false
			continue
		}
		if !o.Allowed {
			continue
		}
		share := float64(l.Result.Used) / float64(l.Limit.Capacity())
		if share > bestShare || (share == bestShare && l.Result.Remaining < o.Limits[o.Decider].Result.Remaining) {
			bestShare, o.Decider = share, i
		}
	}
	if o.Decider < 0 && len(o.Limits) > 0 {
		o.Decider = 0 // only shadow limits matched: report the first
	}
	o.Delay = 0
	if o.Allowed {
		for i := range o.Limits {
			if l := &o.Limits[i]; !l.Rule.Shadow {
				o.Delay = max(o.Delay, l.Result.Delay)
			}
		}
	}
}

// State is the check's warning state: the deciding limit's, except that a check allowed while a
// shadow limit would have denied it is a warning, not throttled.
func (o *Outcome) State() State {
	d := o.DecidingLimit()
	if d == nil {
		return StateNormal
	}
	s := d.State()
	if o.Allowed && s == StateThrottled {
		return StateWarning
	}
	return s
}
