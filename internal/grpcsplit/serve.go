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
		if err := gs.Serve(sp.GRPC()); err != nil {
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
// and cleartext HTTP/2, with a bound on reading request headers.
func NewHTTPServer(h http.Handler) *http.Server {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second}
}

// ServeHTTP serves h alone on ln (a port of its own, such as a metrics port) with HTTP/1.1
// and cleartext HTTP/2 until ctx is done, then shuts down gracefully within timeout. It
// closes ln.
func ServeHTTP(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration) error {
	hs := NewHTTPServer(h)
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
