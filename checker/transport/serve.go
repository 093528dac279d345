package transport

import (
	"context"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/quotaflow/quotaflow/internal/grpcsplit"
)

// grpcStreamWorkers is the number of goroutines reused for gRPC calls; calls beyond it get a
// goroutine of their own.
const grpcStreamWorkers = 128

// Serve serves one port with two stacks until ctx is done: h2c connections whose first request
// is gRPC go to a grpc-go server with RegisterGRPC's services, every other connection to h
// (Handler, and whatever the caller mounts beside it) over HTTP/1.1 and h2c. Shutdown is
// graceful for both within timeout. Serve closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration) error {
	gs := grpc.NewServer(
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: 10 * time.Second, PermitWithoutStream: true, // as lenient as Envoy's own keepalives need
		}),
		// Calls run on reused goroutines whose stacks have already grown: a new goroutine
		// per call spent about 7% of the checker's CPU growing its stack.
		grpc.NumStreamWorkers(grpcStreamWorkers),
		// A check cut off by the shutdown timeout still hands its decision to the publisher
		// before the publisher is drained (checks are bounded by --redis-timeout).
		grpc.WaitForHandlers(true),
	)
	s.RegisterGRPC(gs)
	go func() {
		<-ctx.Done()
		s.log.Info("shutting down", "timeout", timeout)
	}()
	return grpcsplit.Serve(ctx, ln, gs, grpcsplit.NewHTTPServer(h), timeout, grpcsplit.Config{Logger: s.base})
}
