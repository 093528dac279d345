package transport

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/field"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The reservations of quotaflow.v1.RateLimiter: a check charged at an estimate
// (checker.Reservation), settled or cancelled by its id. Each needs the check permission
// (Reserve also the tier's, like a check); the caller settles by knowing the id.

// Reserve implements quotaflow.v1.RateLimiter.
func (s *Server) Reserve(ctx context.Context, req *connect.Request[quotaflowv1.ReserveRequest]) (*connect.Response[quotaflowv1.ReserveResponse], error) {
	return connectResponse(s.reserve(ctx, req.Msg))
}

// Settle implements quotaflow.v1.RateLimiter.
func (s *Server) Settle(ctx context.Context, req *connect.Request[quotaflowv1.SettleRequest]) (*connect.Response[quotaflowv1.SettleResponse], error) {
	return connectResponse(s.settle(ctx, req.Msg))
}

// Cancel implements quotaflow.v1.RateLimiter.
func (s *Server) Cancel(ctx context.Context, req *connect.Request[quotaflowv1.CancelRequest]) (*connect.Response[quotaflowv1.CancelResponse], error) {
	return connectResponse(s.cancel(ctx, req.Msg))
}

// reserveQuery validates a Reserve request: a check without a cost of its own, an estimate of
// at least 1, a TTL within bounds (0: the default).
func reserveQuery(r *quotaflowv1.ReserveRequest, now time.Time) (*checker.Query, error) {
	if r.GetCheck() == nil {
		return nil, field.Errorf("check", "required: the check to reserve for")
	}
	if r.GetCheck().GetCost() != 0 {
		return nil, field.Errorf("check.cost", "must be unset in a reservation: its cost is the estimate")
	}
	if r.GetEstimate() < 1 || r.GetEstimate() > checker.MaxCost {
		return nil, field.Errorf("estimate", "%d is no estimate: want 1 to %d", r.GetEstimate(), int64(checker.MaxCost))
	}
	ttl := checker.DefaultReservationTTL
	if ms := r.GetTtlMs(); ms != 0 {
		if ms < 1 || ms > checker.MaxReservationTTL.Milliseconds() {
			return nil, field.Errorf("ttl_ms", "%d is no reservation TTL: want 1 to %d (0: %d)", ms, checker.MaxReservationTTL.Milliseconds(), checker.DefaultReservationTTL.Milliseconds())
		}
		ttl = time.Duration(ms) * time.Millisecond
	}
	q, err := checkQuery(r.GetCheck(), now)
	if err != nil {
		return nil, err
	}
	q.Cost, q.Reserve = r.GetEstimate(), ttl
	return q, nil
}

func (s *Server) reserve(ctx context.Context, req *quotaflowv1.ReserveRequest) (*quotaflowv1.ReserveResponse, error) {
	if err := s.authorizeCheck(ctx, "Reserve", req.GetCheck().GetTier()); err != nil {
		return nil, err
	}
	q, err := reserveQuery(req, time.Now())
	if err != nil {
		return nil, s.rpcError(err)
	}
	result, out, err := s.answer(ctx, q)
	if err != nil {
		return nil, err
	}
	resp := &quotaflowv1.ReserveResponse{Result: result}
	if r := out.Reservation; r != nil {
		resp.ReservationId, resp.ExpiresAtMs = r.ID, r.ExpiresAt.UnixMilli()
	}
	return resp, nil
}

func (s *Server) settle(ctx context.Context, req *quotaflowv1.SettleRequest) (*quotaflowv1.SettleResponse, error) {
	if err := s.authorize(ctx, auth.Check, "Settle"); err != nil {
		return nil, err
	}
	st, err := s.engine.Settle(ctx, req.GetReservationId(), req.GetActual())
	if err != nil {
		return nil, s.reservationError(err)
	}
	return &quotaflowv1.SettleResponse{Estimate: st.Estimate, Actual: st.Actual, Overage: st.Overage,
		Remaining: st.Remaining, DecisionId: st.ID}, nil
}

func (s *Server) cancel(ctx context.Context, req *quotaflowv1.CancelRequest) (*quotaflowv1.CancelResponse, error) {
	if err := s.authorize(ctx, auth.Check, "Cancel"); err != nil {
		return nil, err
	}
	st, err := s.engine.Cancel(ctx, req.GetReservationId())
	if err != nil {
		return nil, s.reservationError(err)
	}
	return &quotaflowv1.CancelResponse{Estimate: st.Estimate, Remaining: st.Remaining, DecisionId: st.ID}, nil
}

func (g grpcRateLimiter) Reserve(ctx context.Context, req *quotaflowv1.ReserveRequest) (*quotaflowv1.ReserveResponse, error) {
	return grpcResponse(g.s.reserve(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) Settle(ctx context.Context, req *quotaflowv1.SettleRequest) (*quotaflowv1.SettleResponse, error) {
	return grpcResponse(g.s.settle(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) Cancel(ctx context.Context, req *quotaflowv1.CancelRequest) (*quotaflowv1.CancelResponse, error) {
	return grpcResponse(g.s.cancel(g.s.authenticateGRPC(ctx), req))
}
