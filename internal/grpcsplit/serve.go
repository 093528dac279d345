package grpcsplit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Serve serves gs and hs on ln, split by a Splitter with cfg, until ctx is done or either
// server fails; then it stops both, letting calls in flight finish within shutdownTimeout.
// hs must accept cleartext HTTP/2 (Protocols.SetUnencryptedHTTP2) for h2c Connect and
// gRPC-Web clients. Serve closes ln.
func Serve(ctx context.Context, ln net.Listener, gs *grpc.Server, hs *http.Server, shutdownTimeout time.Duration, cfg Config) error {
	sp := New(ln, cfg)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := sp.Serve(); err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		// ErrServerStopped: the shutdown below stopped gs before this goroutine got to serve
		// (ctx was done at once, or another goroutine failed first), a stop like any other.
		if err := gs.Serve(sp.GRPC()); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serve grpc: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := hs.Serve(sp.HTTP()); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		stopped := make(chan struct{})
		go func() {
			gs.GracefulStop()
			close(stopped)
		}()
		err := hs.Shutdown(sctx)
		select {
		case <-stopped:
		case <-sctx.Done():
			gs.Stop()
		}
		if err != nil {
			hs.Close() // what is still open after the timeout is cut off
			err = fmt.Errorf("shutdown: %w", err)
		}
		return errors.Join(err, sp.Close())
	})
	return g.Wait()
}

// NewHTTPServer returns the net/http server of a split port, or of a port of its own: HTTP/1.1
// and cleartext HTTP/2, with cfg's bounds on reading requests and on idle connections, so that
// a client cannot hold a connection (a file handle, a goroutine, buffers) by sending slowly or
// nothing at all.
func NewHTTPServer(h http.Handler, cfg Config) *http.Server {
	cfg = cfg.withDefaults()
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, Protocols: protocols, ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout: cfg.ReadTimeout, IdleTimeout: cfg.IdleTimeout}
}

// GRPCServerOptions are the grpc-go server options that bound its connections as
// NewHTTPServer bounds net/http's: a connection idle for cfg.IdleTimeout gets a GOAWAY.
func GRPCServerOptions(cfg Config) []grpc.ServerOption {
	cfg = cfg.withDefaults()
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.IdleTimeout}),
	}
}

// ServeHTTP serves h alone on ln (a port of its own, such as a metrics port) with HTTP/1.1
// and cleartext HTTP/2, bounded as cfg says, until ctx is done, then shuts down gracefully
// within timeout. It closes ln.
func ServeHTTP(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration, cfg Config) error {
	hs := NewHTTPServer(h, cfg)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		return nil
	})
	return g.Wait()
}
