package transport

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/outcomepb"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The quotaflow.v1.RateLimiter service. Each method has one implementation, returning Connect
// errors, that the connect-go handlers (Server's methods) and the grpc-go ones
// (grpcRateLimiter) wrap.

// CheckRateLimit implements quotaflow.v1.RateLimiter.
func (s *Server) CheckRateLimit(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitRequest]) (*connect.Response[quotaflowv1.CheckRateLimitResponse], error) {
	return connectResponse(s.checkRateLimit(ctx, req.Msg))
}

// GetRemainingQuota implements quotaflow.v1.RateLimiter.
func (s *Server) GetRemainingQuota(ctx context.Context, req *connect.Request[quotaflowv1.GetRemainingQuotaRequest]) (*connect.Response[quotaflowv1.GetRemainingQuotaResponse], error) {
	return connectResponse(s.getRemainingQuota(ctx, req.Msg))
}

// ResetLimit implements quotaflow.v1.RateLimiter.
func (s *Server) ResetLimit(ctx context.Context, req *connect.Request[quotaflowv1.ResetLimitRequest]) (*connect.Response[quotaflowv1.ResetLimitResponse], error) {
	return connectResponse(s.resetLimit(ctx, req.Msg))
}

func connectResponse[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}

func (s *Server) checkRateLimit(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	if err := s.authorizeCheck(ctx, "CheckRateLimit", req.GetTier()); err != nil {
		return nil, err
	}
	return s.decide(ctx, req)
}

// decide makes one check whose caller is authorized: CheckRateLimit's, or one of a batch's.
func (s *Server) decide(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	q, err := checkQuery(req, time.Now())
	if err != nil {
		return nil, s.rpcError(err)
	}
	resp, _, err := s.answer(ctx, q)
	return resp, err
}

// answer decides q, validated, and renders the answer.
func (s *Server) answer(ctx context.Context, q *checker.Query) (*quotaflowv1.CheckRateLimitResponse, *checker.Outcome, error) {
	out, err := s.engine.Check(ctx, q)
	if err != nil {
		return nil, nil, s.rpcError(err)
	}
	return render(q, out), out, nil
}

// render is the answer to q, decided as out.
func render(q *checker.Query, out *checker.Outcome) *quotaflowv1.CheckRateLimitResponse {
	resp := &quotaflowv1.CheckRateLimitResponse{
		Allowed:    out.Allowed,
		Replayed:   out.Replayed,
		Degraded:   out.Degraded,
		Tier:       out.Tier,
		Limits:     outcomepb.Statuses(out),
		State:      outcomepb.State(out.State()),
		DecisionId: out.ID,
		DelayUs:    outcomepb.CeilMicros(out.Delay),
	}
	if q.Timestamp != 0 {
		resp.ClockSkewMs = q.Timestamp - out.Now.UnixMilli()
	}
	if h := out.Lease; h != nil {
		resp.LeaseId, resp.LeaseExpiresAtMs = h.ID, h.ExpiresAt.UnixMilli()
	}
	if d := outcomepb.Deciding(out, resp.Limits); d != nil {
		resp.RuleId, resp.Limit, resp.CurrentCount, resp.Remaining = d.RuleId, d.Burst, d.CurrentCount, d.Remaining
		resp.ResetAt, resp.RetryAfterMs = d.ResetAt, d.RetryAfterMs
		resp.RetryAfter = ratelimitheader.CeilSeconds(d.RetryAfterMs)
	}
	return resp
}

func (s *Server) getRemainingQuota(ctx context.Context, req *quotaflowv1.GetRemainingQuotaRequest) (*quotaflowv1.GetRemainingQuotaResponse, error) {
	if err := s.authorizeCheck(ctx, "GetRemainingQuota", req.GetTier()); err != nil {
		return nil, err
	}
	q, err := quotaQuery(req)
	if err != nil {
		return nil, s.rpcError(err)
	}
	out, err := s.engine.Peek(ctx, q)
	if err != nil {
		return nil, s.rpcError(err)
	}
	resp := &quotaflowv1.GetRemainingQuotaResponse{
		Allowed:  out.Allowed,
		Degraded: out.Degraded,
		Tier:     out.Tier,
		Limits:   outcomepb.Statuses(out),
		State:    outcomepb.State(out.State()),
	}
	if d := outcomepb.Deciding(out, resp.Limits); d != nil {
		resp.RuleId, resp.Limit, resp.CurrentCount, resp.Remaining = d.RuleId, d.Burst, d.CurrentCount, d.Remaining
		resp.ResetAt, resp.RetryAfterMs = d.ResetAt, d.RetryAfterMs
		resp.RetryAfter = ratelimitheader.CeilSeconds(d.RetryAfterMs)
	}
	return resp, nil
}

func (s *Server) resetLimit(ctx context.Context, req *quotaflowv1.ResetLimitRequest) (*quotaflowv1.ResetLimitResponse, error) {
	if err := s.authorize(ctx, auth.Reset, "ResetLimit"); err != nil {
		return nil, err
	}
	rr, err := resetRequest(req)
	if err != nil {
		return nil, s.rpcError(err)
	}
	n, ids, err := s.engine.Reset(ctx, rr)
	if err != nil {
		return nil, s.rpcError(err)
	}
	return &quotaflowv1.ResetLimitResponse{ResetCount: n, RuleIds: ids}, nil
}

// grpcRateLimiter serves the RateLimiter service on grpc-go.
type grpcRateLimiter struct {
	quotaflowv1.UnimplementedRateLimiterServer
	s *Server
}

func grpcResponse[T any](msg *T, err error) (*T, error) {
	if err != nil {
		return nil, grpcError(err)
	}
	return msg, nil
}

func (g grpcRateLimiter) CheckRateLimit(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	return grpcResponse(g.s.checkRateLimit(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) CheckRateLimits(ctx context.Context, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, error) {
	return grpcResponse(g.s.checkRateLimits(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) GetRemainingQuota(ctx context.Context, req *quotaflowv1.GetRemainingQuotaRequest) (*quotaflowv1.GetRemainingQuotaResponse, error) {
	return grpcResponse(g.s.getRemainingQuota(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) ResetLimit(ctx context.Context, req *quotaflowv1.ResetLimitRequest) (*quotaflowv1.ResetLimitResponse, error) {
	return grpcResponse(g.s.resetLimit(g.s.authenticateGRPC(ctx), req))
}
