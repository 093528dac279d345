package transport

import (
	"context"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The concurrency leases of quotaflow.v1.RateLimiter: a check's places in flight
// (checker.Lease), released or renewed by their id. The caller needs the check permission; it
// is the holder by knowing the id.

// ReleaseLease implements quotaflow.v1.RateLimiter.
func (s *Server) ReleaseLease(ctx context.Context, req *connect.Request[quotaflowv1.ReleaseLeaseRequest]) (*connect.Response[quotaflowv1.ReleaseLeaseResponse], error) {
	return connectResponse(s.releaseLease(ctx, req.Msg))
}

// RenewLease implements quotaflow.v1.RateLimiter.
func (s *Server) RenewLease(ctx context.Context, req *connect.Request[quotaflowv1.RenewLeaseRequest]) (*connect.Response[quotaflowv1.RenewLeaseResponse], error) {
	return connectResponse(s.renewLease(ctx, req.Msg))
}

func (s *Server) releaseLease(ctx context.Context, req *quotaflowv1.ReleaseLeaseRequest) (*quotaflowv1.ReleaseLeaseResponse, error) {
	if err := s.authorize(ctx, auth.Check, "ReleaseLease"); err != nil {
		return nil, err
	}
	if err := s.engine.Release(ctx, req.GetLeaseId()); err != nil {
		return nil, s.leaseError(err)
	}
	return &quotaflowv1.ReleaseLeaseResponse{}, nil
}

func (s *Server) renewLease(ctx context.Context, req *quotaflowv1.RenewLeaseRequest) (*quotaflowv1.RenewLeaseResponse, error) {
	if err := s.authorize(ctx, auth.Check, "RenewLease"); err != nil {
		return nil, err
	}
	at, err := s.engine.Renew(ctx, req.GetLeaseId())
	if err != nil {
		return nil, s.leaseError(err)
	}
	return &quotaflowv1.RenewLeaseResponse{ExpiresAtMs: at.UnixMilli()}, nil
}

func (g grpcRateLimiter) ReleaseLease(ctx context.Context, req *quotaflowv1.ReleaseLeaseRequest) (*quotaflowv1.ReleaseLeaseResponse, error) {
	return grpcResponse(g.s.releaseLease(g.s.authenticateGRPC(ctx), req))
}

func (g grpcRateLimiter) RenewLease(ctx context.Context, req *quotaflowv1.RenewLeaseRequest) (*quotaflowv1.RenewLeaseResponse, error) {
	return grpcResponse(g.s.renewLease(g.s.authenticateGRPC(ctx), req))
}
