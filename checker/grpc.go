package checker

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// RegisterGRPC registers the services Handler serves to gRPC clients — quotaflow.v1.RateLimiter,
// Envoy's RateLimitService, grpc.health.v1.Health and reflection — on a grpc-go server. Serve it
// the h2c connections whose first request is gRPC (see internal/grpcsplit): grpc-go's HTTP/2
// transport costs far less per call than net/http's, and the answers are the same.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	quotaflowv1.RegisterRateLimiterServer(g, grpcRateLimiter{s: s})
	ratelimitv3.RegisterRateLimitServiceServer(g, grpcRLS{s})
	healthpb.RegisterHealthServer(g, grpcHealth{h: &healthService{s: s}})
	reflection.Register(g)
}

// grpcError turns a Connect error into a gRPC status; the codes are the same numbers.
func grpcError(err error) error {
	if ce := new(connect.Error); errors.As(err, &ce) {
		return status.Error(codes.Code(ce.Code()), ce.Message())
	}
	return status.Error(codes.Unknown, err.Error())
}

type grpcRateLimiter struct {
	quotaflowv1.UnimplementedRateLimiterServer
	s *Server
}

func (g grpcRateLimiter) CheckRateLimit(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	resp, err := g.s.checkRateLimit(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

func (g grpcRateLimiter) GetRemainingQuota(ctx context.Context, req *quotaflowv1.GetRemainingQuotaRequest) (*quotaflowv1.GetRemainingQuotaResponse, error) {
	resp, err := g.s.getRemainingQuota(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

func (g grpcRateLimiter) ResetLimit(ctx context.Context, req *quotaflowv1.ResetLimitRequest) (*quotaflowv1.ResetLimitResponse, error) {
	resp, err := g.s.resetLimit(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

type grpcRLS struct {
	s *Server
}

func (g grpcRLS) ShouldRateLimit(ctx context.Context, req *ratelimitv3.RateLimitRequest) (*ratelimitv3.RateLimitResponse, error) {
	resp, err := g.s.shouldRateLimit(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

type grpcHealth struct {
	healthpb.UnimplementedHealthServer
	h *healthService
}

func (g grpcHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, err := g.h.status(ctx, req.GetService())
	if err != nil {
		return nil, grpcError(err)
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

func (g grpcHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if err := g.h.watch(stream.Context(), req.GetService(), stream.Send); err != nil {
		return grpcError(err)
	}
	return nil
}
