package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/quotaflow/quotaflow/internal/grpcsplit"
)

// grpcStreamWorkers is the number of goroutines reused for gRPC calls; calls beyond it get a
// goroutine of their own.
const grpcStreamWorkers = 128

// grpcWindow is the flow-control window of a gRPC stream and of a connection: 1 MiB, sixteen
// times grpc-go's initial 64 KiB, so that a connection carrying many concurrent checks (Envoy
// multiplexes them on few) never waits for a window update.
const grpcWindow = 1 << 20

// Serve serves one port with two stacks until ctx is done: connections whose first request is
// gRPC go to a grpc-go server with RegisterGRPC's services, every other connection to h
// (Handler, and whatever the caller mounts beside it) over HTTP/1.1 and HTTP/2. With
// Config.TLS the port serves TLS (the splitter sorts the decrypted streams), else cleartext
// with h2c. Config.Conns bounds the connections: how many, how slow, how long idle. Shutdown
// is graceful for both within timeout. Serve closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration) error {
	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: 10 * time.Second, PermitWithoutStream: true, // as lenient as Envoy's own keepalives need
		}),
		// Calls run on reused goroutines whose stacks have already grown: a new goroutine
		// per call spent about 7% of the checker's CPU growing its stack.
		grpc.NumStreamWorkers(grpcStreamWorkers),
		// Fixed flow-control windows turn off grpc-go's bandwidth estimator, which otherwise
		// answers a request that finds the connection quiet with a window update and a ping of
		// its own: one more write and one more read per check at moderate load, for a window
		// that small checks never fill.
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		// A check cut off by the shutdown timeout still hands its decision to the publisher
		// before the publisher is drained (checks are bounded by --redis-timeout).
		grpc.WaitForHandlers(true),
		// The same bound as Handler's, on the decompressed message too.
		grpc.MaxRecvMsgSize(int(s.maxBody)),
	}
	split := s.conns
	split.Logger = s.base
	opts = append(opts, grpcsplit.GRPCServerOptions(split)...)
	hs := grpcsplit.NewHTTPServer(h, split)
	if s.tls != nil {
		ln = tls.NewListener(ln, s.tls)
		opts = append(opts, grpc.Creds(terminatedTLS{}))
		hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if st := grpcsplit.TLSState(c); st != nil {
				return context.WithValue(ctx, tlsStateKey{}, st)
			}
			return ctx
		}
	}
	gs := grpc.NewServer(opts...)
	s.RegisterGRPC(gs)
	go func() {
		<-ctx.Done()
		s.log.Info("shutting down", "timeout", timeout)
	}()
	return grpcsplit.Serve(ctx, ln, gs, hs, timeout, split)
}

// terminatedTLS are grpc-go's credentials on a port whose listener terminates TLS: the
// handshake is done before grpc-go sees the connection, so the server handshake only reports
// the connection's TLS state (whose client certificate may name a caller).
type terminatedTLS struct{}

func (terminatedTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	st := grpcsplit.TLSState(c)
	if st == nil {
		return nil, nil, errors.New("transport: a connection without TLS on a TLS port")
	}
	return c, credentials.TLSInfo{State: *st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (terminatedTLS) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("transport: server-side credentials")
}

func (terminatedTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (terminatedTLS) Clone() credentials.TransportCredentials { return terminatedTLS{} }

func (terminatedTLS) OverrideServerName(string) error { return nil }
