package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/certtest"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/tlsfiles"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// TestTLS: the port serves TLS to Connect and grpc-go clients alike, requires client
// certificates signed by the client CA, names callers by them, and serves a rotated server
// certificate without a restart.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "quotaflow-test")
	certFile, keyFile := ca.Server(t, "checker")
	cfg, err := tlsfiles.Server(certFile, keyFile, ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	reg := new(auth.Registry)
	if err := reg.Load([]byte("callers:\n  - {name: ops, certificate: ops.internal, permissions: [check, reset]}\n")); err != nil {
		t.Fatal(err)
	}
	rdb := redisSrv.UniversalClient()
	defer rdb.Close()
	engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(t, testRules), RedisTimeout: 5 * time.Second, Logger: checkertest.Logger()})
	defer engine.Close()
	srv := New(engine, Config{Callers: reg, TLS: cfg, Logger: checkertest.Logger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, srv.Handler(), time.Second) }()
	defer func() { cancel(); <-done }()
	addr := ln.Addr().String()

	roots := x509.NewCertPool()
	pem, _ := os.ReadFile(ca.CertFile)
	roots.AppendCertsFromPEM(pem)
	clientTLS := func(cn string) *tls.Config {
		c := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
		if cn != "" {
			cf, kf := ca.Client(t, cn)
			kp, err := tls.LoadX509KeyPair(cf, kf)
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates = []tls.Certificate{kp}
		}
		return c
	}
	connectClient := func(cn string, h2 bool) quotaflowv1connect.RateLimiterClient {
		tr := &http.Transport{TLSClientConfig: clientTLS(cn), ForceAttemptHTTP2: h2}
		return quotaflowv1connect.NewRateLimiterClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://"+addr)
	}
	reset := connect.NewRequest(&quotaflowv1.ResetLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER})

	// The caller named by its certificate may reset, over HTTP/1.1 and HTTP/2.
	for _, h2 := range []bool{false, true} {
		if _, err := connectClient("ops.internal", h2).ResetLimit(context.Background(), reset); err != nil {
			t.Errorf("Connect ResetLimit with the ops certificate (h2 %v): %v", h2, err)
		}
	}
	// A certificate of the CA that names no caller is no one's.
	if _, err := connectClient("stranger", true).CheckRateLimit(context.Background(), checkReq(id(t, "u"), "/orders")); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("check with a stranger's certificate = %v, want Unauthenticated", err)
	}
	// No client certificate: the handshake fails.
	if _, err := connectClient("", true).CheckRateLimit(context.Background(), checkReq(id(t, "u"), "/orders")); err == nil {
		t.Error("check without a client certificate succeeded")
	}
	// grpc-go over TLS, named by its certificate.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS("ops.internal"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gc := quotaflowv1.NewRateLimiterClient(conn)
	if _, err := gc.ResetLimit(context.Background(), reset.Msg); err != nil {
		t.Errorf("grpc-go ResetLimit with the ops certificate: %v", err)
	}
	stranger, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS("stranger"))))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	if _, err := quotaflowv1.NewRateLimiterClient(stranger).ResetLimit(context.Background(), reset.Msg); status.Code(err) != codes.Unauthenticated {
		t.Errorf("grpc-go ResetLimit with a stranger's certificate = %v, want Unauthenticated", err)
	}

	// A rotated certificate is served to new connections without a restart.
	serial := func() string {
		c, err := tls.Dial("tcp", addr, clientTLS("ops.internal"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	newCert, newKey := ca.Server(t, "checker-rotated")
	for _, f := range [][2]string{{newCert, certFile}, {newKey, keyFile}} {
		data, _ := os.ReadFile(f[0])
		if err := os.WriteFile(f[1], data, 0o600); err != nil {
			t.Fatal(err)
		}
		future := time.Now().Add(2 * time.Second)
		os.Chtimes(f[1], future, future)
	}
	deadline := time.Now().Add(5 * time.Second)
	for serial() == before {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was not served within 5s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
