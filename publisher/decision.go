package publisher

import (
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/outcomepb"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

var _ checker.DecisionSink = (*Client)(nil)

// Publish renders out, the decision of q made by the checker checkerID, as the stream's event
// (Decision) and hands it on as PublishDecision does: it returns at once. It implements
// checker.DecisionSink: the rendering happens before it returns, so the client keeps nothing
// of q or out.
func (c *Client) Publish(checkerID string, q *checker.Query, out *checker.Outcome) {
	c.PublishDecision(Decision(checkerID, q, out))
}

// Decision renders out, the decision of q made by the checker checkerID, as the event the
// decision stream carries.
func Decision(checkerID string, q *checker.Query, out *checker.Outcome) *quotaflowv1.Decision {
	d := &quotaflowv1.Decision{
		Id:        out.ID,
		CheckerId: checkerID,
		TimeUs:    out.Now.UnixMicro(),
		Subjects:  make([]*quotaflowv1.Subject, len(q.Subjects)),
		Tier:      out.Tier,
		Endpoint:  q.Endpoint,
		Cost:      q.Cost,
		Allowed:   out.Allowed,
		Degraded:  out.Degraded,
		Replayed:  out.Replayed,
		Limits:    outcomepb.Statuses(out),
		State:     outcomepb.State(out.State()),
		Exemption: out.Exemption,
		DelayUs:   outcomepb.CeilMicros(out.Delay),
	}
	for i, sub := range q.Subjects {
		d.Subjects[i] = &quotaflowv1.Subject{Dimension: outcomepb.Dimension(sub.Dimension), Identifier: sub.ID}
	}
	if len(d.Subjects) > 0 {
		d.Subject = d.Subjects[0]
	}
	if q.Timestamp != 0 {
		d.ClockSkewMs = q.Timestamp - out.Now.UnixMilli()
	}
	for _, l := range d.Limits {
		// A candidate's denial is compared with its live rule's, not counted as a shadow
		// rule's (the rollups' shadow_denied).
		if l.Shadow && !l.Allowed && l.CandidateOf == "" {
			d.Shadow = true
		}
	}
	if h := out.Lease; h != nil {
		d.LeaseId = checker.IDDigest(h.ID)
	}
	if q.Reserve > 0 {
		d.Kind, d.EstimatedCost = quotaflowv1.Kind_KIND_RESERVE, q.Cost
		if r := out.Reservation; r != nil {
			d.ReservationId = checker.IDDigest(r.ID)
		}
	}
	if st := out.Settlement; st != nil {
		d.Kind = quotaflowv1.Kind_KIND_SETTLE
		if st.Cancelled {
			d.Kind = quotaflowv1.Kind_KIND_CANCEL
		}
		d.ReservationId, d.EstimatedCost, d.ActualCost, d.Overage = checker.IDDigest(st.ReservationID), st.Estimate, st.Actual, st.Overage
		d.Remaining, d.RuleId = st.Remaining, st.RuleID
	}
	if out.Recovered {
		d.Kind = quotaflowv1.Kind_KIND_RECOVERED
	}
	if r := out.Released; r != nil {
		d.Kind, d.LeaseId = quotaflowv1.Kind_KIND_LEASE_RELEASE, checker.IDDigest(r.LeaseID)
		if r.Expired {
			d.Kind = quotaflowv1.Kind_KIND_LEASE_EXPIRED
		}
	}
	if l := outcomepb.Deciding(out, d.Limits); l != nil {
		d.RuleId, d.Algorithm, d.Limit, d.Remaining, d.CurrentCount = l.RuleId, l.Algorithm, l.Burst, l.Remaining, l.CurrentCount
		d.WindowMs, d.ResetAt, d.RetryAfterMs, d.FailMode = l.WindowMs, l.ResetAt, l.RetryAfterMs, l.FailMode
	}
	return d
}
