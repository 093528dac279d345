package checker

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// DecisionSink receives every decision the checker makes (allowed, denied, shadow, degraded),
// for the decision stream. publisher.Client satisfies it.
type DecisionSink interface {
	// Publish takes ownership of d. It is called on the check's path: it must return at once
	// and never fail the check.
	Publish(d *quotaflowv1.Decision)
}

// newInstanceID returns 12 random hex characters: unique per process start for all practical
// purposes, and short enough to prefix every decision id.
func newInstanceID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// nextDecisionID returns "<instance id>-<sequence>": unique without coordination or a random
// draw per decision.
func (s *Server) nextDecisionID() string {
	n := s.decisionSeq.Add(1)
	b := make([]byte, 0, len(s.instanceID)+1+20)
	b = append(b, s.instanceID...)
	b = append(b, '-')
	return string(strconv.AppendUint(b, n, 10))
}

// decision renders the outcome of q as the event the stream carries.
func (o *outcome) decision(q *query, checkerID string) *quotaflowv1.Decision {
	d := &quotaflowv1.Decision{
		Id:        o.id,
		CheckerId: checkerID,
		TimeUs:    o.now.UnixMicro(),
		Subjects:  make([]*quotaflowv1.Subject, len(q.subjects)),
		Tier:      o.tier,
		Endpoint:  q.endpoint,
		Cost:      q.cost,
		Allowed:   o.allowed,
		Degraded:  o.degraded,
		Replayed:  o.replayed,
		Limits:    o.statuses(),
		State:     o.state(),
	}
	for i, sub := range q.subjects {
		d.Subjects[i] = &quotaflowv1.Subject{Dimension: protoDimension(sub.dim), Identifier: sub.id}
	}
	if len(d.Subjects) > 0 {
		d.Subject = d.Subjects[0]
	}
	if q.timestamp != 0 {
		d.ClockSkewMs = q.timestamp - o.now.UnixMilli()
	}
	for _, l := range d.Limits {
		if l.Shadow && !l.Allowed {
			d.Shadow = true
		}
	}
	if l := o.deciding(); l != nil {
		d.RuleId, d.Algorithm, d.Limit, d.Remaining, d.CurrentCount = l.RuleId, l.Algorithm, l.Burst, l.Remaining, l.CurrentCount
		d.WindowMs, d.ResetAt, d.RetryAfterMs, d.FailMode = l.WindowMs, l.ResetAt, l.RetryAfterMs, l.FailMode
	}
	return d
}
