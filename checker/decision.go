package checker

import (
	"strconv"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// DecisionSink receives every decision the engine makes (allowed, denied, shadow, degraded),
// for the decision stream. publisher.Client satisfies it.
type DecisionSink interface {
	// Publish takes ownership of d. It is called on the check's path: it must return at once
	// and never fail the check.
	Publish(d *quotaflowv1.Decision)
}

// nextDecisionID returns "<instance id>-<sequence>": unique without coordination or a random
// draw per decision.
func (e *Engine) nextDecisionID() string {
	n := e.decisionSeq.Add(1)
	b := make([]byte, 0, len(e.instanceID)+1+20)
	b = append(b, e.instanceID...)
	b = append(b, '-')
	return string(strconv.AppendUint(b, n, 10))
}

// decision renders the outcome of q as the event the stream carries.
func (o *Outcome) decision(q *Query, checkerID string) *quotaflowv1.Decision {
	d := &quotaflowv1.Decision{
		Id:        o.ID,
		CheckerId: checkerID,
		TimeUs:    o.Now.UnixMicro(),
		Subjects:  make([]*quotaflowv1.Subject, len(q.Subjects)),
		Tier:      o.Tier,
		Endpoint:  q.Endpoint,
		Cost:      q.Cost,
		Allowed:   o.Allowed,
		Degraded:  o.Degraded,
		Replayed:  o.Replayed,
		Limits:    o.Statuses(),
		State:     o.State(),
	}
	for i, sub := range q.Subjects {
		d.Subjects[i] = &quotaflowv1.Subject{Dimension: protoDimension(sub.Dimension), Identifier: sub.ID}
	}
	if len(d.Subjects) > 0 {
		d.Subject = d.Subjects[0]
	}
	if q.Timestamp != 0 {
		d.ClockSkewMs = q.Timestamp - o.Now.UnixMilli()
	}
	for _, l := range d.Limits {
		if l.Shadow && !l.Allowed {
			d.Shadow = true
		}
	}
	if l := o.Deciding(); l != nil {
		d.RuleId, d.Algorithm, d.Limit, d.Remaining, d.CurrentCount = l.RuleId, l.Algorithm, l.Burst, l.Remaining, l.CurrentCount
		d.WindowMs, d.ResetAt, d.RetryAfterMs, d.FailMode = l.WindowMs, l.ResetAt, l.RetryAfterMs, l.FailMode
	}
	return d
}
