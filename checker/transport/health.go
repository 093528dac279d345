package transport

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// The gRPC health service, served with connect-go's generic handlers on grpc's own generated
// types (connectrpc.com/grpchealth is not on this project's module proxy).
const (
	healthServiceName    = "grpc.health.v1.Health"
	healthCheckProcedure = "/grpc.health.v1.Health/Check"
	healthWatchProcedure = "/grpc.health.v1.Health/Watch"
)

// healthService is grpc.health.v1.Health: SERVING while Ready.
type healthService struct{ s *Server }

func (h *healthService) handler(opts ...connect.HandlerOption) (string, http.Handler) {
	mux := http.NewServeMux()
	mux.Handle(healthCheckProcedure, connect.NewUnaryHandler(healthCheckProcedure, h.Check, opts...))
	mux.Handle(healthWatchProcedure, connect.NewServerStreamHandler(healthWatchProcedure, h.Watch, opts...))
	return "/" + healthServiceName + "/", mux
}

func (h *healthService) status(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	if service != "" && service != quotaflowv1connect.RateLimiterName {
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", service))
	}
	if h.s.engine.Ready(ctx) != nil {
		return healthpb.HealthCheckResponse_NOT_SERVING, nil
	}
	return healthpb.HealthCheckResponse_SERVING, nil
}

// Check implements grpc.health.v1.Health.
func (h *healthService) Check(ctx context.Context, req *connect.Request[healthpb.HealthCheckRequest]) (*connect.Response[healthpb.HealthCheckResponse], error) {
	st, err := h.status(ctx, req.Msg.GetService())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&healthpb.HealthCheckResponse{Status: st}), nil
}

// Watch implements grpc.health.v1.Health: it sends the status now and on every change.
func (h *healthService) Watch(ctx context.Context, req *connect.Request[healthpb.HealthCheckRequest], stream *connect.ServerStream[healthpb.HealthCheckResponse]) error {
	return h.watch(ctx, req.Msg.GetService(), stream.Send)
}

// watch serves Watch for both RPC stacks.
func (h *healthService) watch(ctx context.Context, service string, send func(*healthpb.HealthCheckResponse) error) error {
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st, err := h.status(ctx, service)
		if err != nil {
			return err
		}
		if st != last {
			if err := send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// grpcHealth serves the health service on grpc-go.
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
