package transport

import (
	"context"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// GetBalance implements quotaflow.v1.RateLimiter.
func (s *Server) GetBalance(ctx context.Context, req *connect.Request[quotaflowv1.GetBalanceRequest]) (*connect.Response[quotaflowv1.GetBalanceResponse], error) {
	return connectResponse(s.getBalance(ctx, req.Msg))
}

func (g grpcRateLimiter) GetBalance(ctx context.Context, req *quotaflowv1.GetBalanceRequest) (*quotaflowv1.GetBalanceResponse, error) {
	return grpcResponse(g.s.getBalance(g.s.authenticateGRPC(ctx), req))
}

// getBalance answers a balance to a caller that may check: a balance is what its checks burn.
func (s *Server) getBalance(ctx context.Context, req *quotaflowv1.GetBalanceRequest) (*quotaflowv1.GetBalanceResponse, error) {
	if err := s.authorize(ctx, auth.Check, "GetBalance"); err != nil {
		return nil, err
	}
	b, err := s.engine.Balance(ctx, req.GetEntitlement(), req.GetSubject())
	if err != nil {
		return nil, s.rpcError(err)
	}
	return balanceResponse(b), nil
}

// RecordUsage implements quotaflow.v1.RateLimiter.
func (s *Server) RecordUsage(ctx context.Context, req *connect.Request[quotaflowv1.RecordUsageRequest]) (*connect.Response[quotaflowv1.RecordUsageResponse], error) {
	return connectResponse(s.recordUsage(ctx, req.Msg))
}

func (g grpcRateLimiter) RecordUsage(ctx context.Context, req *quotaflowv1.RecordUsageRequest) (*quotaflowv1.RecordUsageResponse, error) {
	return grpcResponse(g.s.recordUsage(g.s.authenticateGRPC(ctx), req))
}

// recordUsage burns usage measured elsewhere for a caller that may check: it burns what its
// checks would.
func (s *Server) recordUsage(ctx context.Context, req *quotaflowv1.RecordUsageRequest) (*quotaflowv1.RecordUsageResponse, error) {
	if err := s.authorize(ctx, auth.Check, "RecordUsage"); err != nil {
		return nil, err
	}
	r, err := s.engine.RecordUsage(ctx, checker.MeteredUsage{Entitlement: req.GetEntitlement(), Subject: req.GetSubject(),
		Amount: req.GetAmount(), EventID: req.GetEventId(), Endpoint: req.GetEndpoint()})
	if err != nil {
		return nil, s.rpcError(err)
	}
	return &quotaflowv1.RecordUsageResponse{DecisionId: r.DecisionID, Replayed: r.Replayed, Taken: r.Taken, Excess: r.Excess,
		Balance: balanceResponse(r.Balance)}, nil
}

// balanceResponse renders a balance.
func balanceResponse(b checker.Balance) *quotaflowv1.GetBalanceResponse {
	resp := &quotaflowv1.GetBalanceResponse{Entitlement: b.Entitlement, Dimension: b.Dimension, Subject: b.Subject,
		PeriodStartMs: b.PeriodStart.UnixMilli(), PeriodEndMs: b.PeriodEnd.UnixMilli(), Used: b.Used, Overage: b.Overage,
		Remaining: b.Remaining}
	for _, g := range b.Grants {
		pb := &quotaflowv1.GrantBalance{Id: g.ID, Amount: g.Amount, Remaining: g.Remaining, Priority: int32(g.Priority),
			Recurring: g.Recurring, Live: g.Live, Reason: g.Reason}
		if !g.EffectiveAt.IsZero() {
			pb.EffectiveAtMs = g.EffectiveAt.UnixMilli()
		}
		if !g.ExpiresAt.IsZero() {
			pb.ExpiresAtMs = g.ExpiresAt.UnixMilli()
		}
		if !g.VoidedAt.IsZero() {
			pb.VoidedAtMs = g.VoidedAt.UnixMilli()
		}
		resp.Grants = append(resp.Grants, pb)
	}
	return resp
}
