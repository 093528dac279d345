package checker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"

	"github.com/quotaflow/quotaflow/internal/rules"
)

var _ quotaflowv1connect.RateLimiterHandler = (*Server)(nil)

// CheckRateLimit implements quotaflow.v1.RateLimiter.
func (s *Server) CheckRateLimit(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitRequest]) (*connect.Response[quotaflowv1.CheckRateLimitResponse], error) {
	resp, err := s.checkRateLimit(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// checkRateLimit serves CheckRateLimit for both RPC stacks; its errors are Connect errors.
func (s *Server) checkRateLimit(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	q, err := newCheckQuery(req, time.Now())
	if err != nil {
		return nil, rpcError(err)
	}
	out, err := s.decide(ctx, q, false)
	if err != nil {
		return nil, rpcError(err)
	}
	resp := &quotaflowv1.CheckRateLimitResponse{
		Allowed:    out.allowed,
		Replayed:   out.replayed,
		Degraded:   out.degraded,
		Tier:       out.tier,
		Limits:     out.statuses(),
		State:      out.state(),
		DecisionId: out.id,
	}
	if q.timestamp != 0 {
		resp.ClockSkewMs = q.timestamp - out.now.UnixMilli()
	}
	if d := out.deciding(); d != nil {
		resp.RuleId, resp.Limit, resp.CurrentCount, resp.Remaining = d.RuleId, d.Burst, d.CurrentCount, d.Remaining
		resp.ResetAt, resp.RetryAfterMs = d.ResetAt, d.RetryAfterMs
		resp.RetryAfter = ceilSeconds(d.RetryAfterMs)
	}
	return resp, nil
}

// GetRemainingQuota implements quotaflow.v1.RateLimiter.
func (s *Server) GetRemainingQuota(ctx context.Context, req *connect.Request[quotaflowv1.GetRemainingQuotaRequest]) (*connect.Response[quotaflowv1.GetRemainingQuotaResponse], error) {
	resp, err := s.getRemainingQuota(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s *Server) getRemainingQuota(ctx context.Context, req *quotaflowv1.GetRemainingQuotaRequest) (*quotaflowv1.GetRemainingQuotaResponse, error) {
	q, err := newQuotaQuery(req)
	if err != nil {
		return nil, rpcError(err)
	}
	out, err := s.decide(ctx, q, true)
	if err != nil {
		return nil, rpcError(err)
	}
	resp := &quotaflowv1.GetRemainingQuotaResponse{
		Allowed:  out.allowed,
		Degraded: out.degraded,
		Tier:     out.tier,
		Limits:   out.statuses(),
		State:    out.state(),
	}
	if d := out.deciding(); d != nil {
		resp.RuleId, resp.Limit, resp.CurrentCount, resp.Remaining = d.RuleId, d.Burst, d.CurrentCount, d.Remaining
		resp.ResetAt, resp.RetryAfterMs = d.ResetAt, d.RetryAfterMs
		resp.RetryAfter = ceilSeconds(d.RetryAfterMs)
	}
	return resp, nil
}

// ResetLimit implements quotaflow.v1.RateLimiter.
func (s *Server) ResetLimit(ctx context.Context, req *connect.Request[quotaflowv1.ResetLimitRequest]) (*connect.Response[quotaflowv1.ResetLimitResponse], error) {
	resp, err := s.resetLimit(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (s *Server) resetLimit(ctx context.Context, req *quotaflowv1.ResetLimitRequest) (*quotaflowv1.ResetLimitResponse, error) {
	n, ids, err := s.reset(ctx, req)
	if err != nil {
		return nil, rpcError(err)
	}
	return &quotaflowv1.ResetLimitResponse{ResetCount: n, RuleIds: ids}, nil
}

// reset deletes the buckets of one subject for every rule of its dimension (whatever the
// tier), or only the rules that apply to an endpoint, or one rule.
func (s *Server) reset(ctx context.Context, r *quotaflowv1.ResetLimitRequest) (int64, []string, error) {
	set := s.rules.Load()
	if set == nil {
		return 0, nil, errNoRules
	}
	var sub subject
	if r.GetDimension() == quotaflowv1.Dimension_DIMENSION_GLOBAL {
		sub = globalSubject
	} else {
		d, err := checkSubject("", r.GetDimension(), r.GetIdentifier())
		if err != nil {
			return 0, nil, err
		}
		sub = subject{d, r.GetIdentifier()}
	}
	if ep := r.GetEndpoint(); ep != "" {
		if err := checkText("endpoint", ep, MaxEndpointLen); err != nil {
			return 0, nil, err
		}
	}
	if id := r.GetRuleId(); id != "" {
		rule, ok := set.Rule(id)
		if !ok {
			return 0, nil, fieldErr("rule_id", "no rule has id %q", id)
		}
		if rule.Dimension != sub.dim {
			return 0, nil, fieldErr("rule_id", "rule %q counts per %s, not per %s", id, rule.Dimension, sub.dim)
		}
	}
	applies := map[*rules.Rule]bool{}
	if ep := r.GetEndpoint(); ep != "" {
		for _, t := range set.Tiers() {
			for _, rule := range set.Match(sub.dim, t.Name, ep) {
				applies[rule] = true
			}
		}
	}
	tag := subjectTag(sub.dim, sub.id)
	var keys, ids []string
	seen := map[string]bool{}
	for i := range set.Rules() {
		rule := &set.Rules()[i]
		switch {
		case rule.Dimension != sub.dim,
			r.GetRuleId() != "" && rule.ID != r.GetRuleId(),
			r.GetEndpoint() != "" && !applies[rule]:
			continue
		}
		ids = append(ids, rule.ID)
		if k := limitKey(tag, rule); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return 0, ids, nil
	}
	if s.olc != nil {
		s.olc.forget(keys)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.store.Delete(ctx, keys...)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errRedisUnavailable, err)
	}
	return n, ids, nil
}

// statuses renders every evaluated limit, once: the response and the decision event share it.
func (o *outcome) statuses() []*quotaflowv1.LimitStatus {
	if o.rendered != nil || len(o.limits) == 0 {
		return o.rendered
	}
	out := make([]*quotaflowv1.LimitStatus, len(o.limits))
	for i := range o.limits {
		l := &o.limits[i]
		out[i] = &quotaflowv1.LimitStatus{
			RuleId:       l.rule.ID,
			Dimension:    protoDimension(l.subject.dim),
			Identifier:   l.subject.id,
			Endpoint:     l.rule.Endpoint,
			Algorithm:    l.rule.Algorithm.String(),
			Limit:        l.limit.Limit,
			Burst:        l.limit.Capacity(),
			WindowMs:     l.limit.Window.Milliseconds(),
			Allowed:      l.res.Allowed,
			CurrentCount: l.res.Used,
			Remaining:    l.res.Remaining,
			ResetAt:      ceilUnix(l.res.ResetAt),
			RetryAfterMs: ceilMillis(l.res.RetryAfter),
			Shadow:       l.rule.Shadow,
			State:        l.state(),
			Degraded:     l.degraded,
		}
		if l.degraded {
			out[i].FailMode = l.rule.FailMode.String()
		}
	}
	o.rendered = out
	return out
}

// deciding returns the deciding limit's status, or nil when no rule matched.
func (o *outcome) deciding() *quotaflowv1.LimitStatus {
	if o.decider < 0 {
		return nil
	}
	return o.statuses()[o.decider]
}

// state is the check's warning state: the deciding limit's, except that a check allowed while a
// shadow limit would have denied it is a warning, not throttled.
func (o *outcome) state() quotaflowv1.State {
	d := o.deciding()
	switch {
	case d == nil:
		return quotaflowv1.State_STATE_NORMAL
	case o.allowed && d.State == quotaflowv1.State_STATE_THROTTLED:
		return quotaflowv1.State_STATE_WARNING
	}
	return d.State
}

func protoDimension(d rules.Dimension) quotaflowv1.Dimension {
	switch d {
	case rules.DimensionUser:
		return quotaflowv1.Dimension_DIMENSION_USER
	case rules.DimensionIP:
		return quotaflowv1.Dimension_DIMENSION_IP
	case rules.DimensionAPIKey:
		return quotaflowv1.Dimension_DIMENSION_API_KEY
	case rules.DimensionGlobal:
		return quotaflowv1.Dimension_DIMENSION_GLOBAL
	}
	return quotaflowv1.Dimension_DIMENSION_UNSPECIFIED
}

func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func ceilSeconds(ms int64) int64 { return (ms + 999) / 1000 }

func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// rpcError maps an error to its Connect code: a broken request is InvalidArgument, missing
// rules Unavailable, a caller that gave up Canceled or DeadlineExceeded.
func rpcError(err error) error {
	switch {
	case isFieldError(err):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errNoRules), errors.Is(err, errRedisUnavailable):
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}
