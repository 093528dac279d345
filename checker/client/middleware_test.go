package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/quotaflow/quotaflow/checker/client"
)

// TestMiddleware: a service behind the middleware answers 3 requests of a user, then 429 with
// Retry-After and the RateLimit fields; a request without subjects is not checked.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })))
	defer svc.Close()
	u := user(t, "u")
	get := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, svc.URL+"/orders", nil)
		req.Header.Set("X-User", u)
		resp, err := svc.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := 1; i <= 3; i++ {
		resp := get()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(3-i) || resp.Header.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: %d, X-RateLimit-Limit %q Remaining %q; want 200, 3, %d", i, resp.StatusCode,
				resp.Header.Get("X-RateLimit-Limit"), resp.Header.Get("X-RateLimit-Remaining"), 3-i)
		}
	}
	for _, source := range []string{"checker", "deny cache"} {
		resp := get()
		h := resp.Header
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("4th request (%s): %d, want 429", source, resp.StatusCode)
		}
		if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 || ra > 3600 {
			t.Errorf("%s: Retry-After = %q, want 1..3600 seconds", source, h.Get("Retry-After"))
		}
		if !regexp.MustCompile(`^"user-orders";r=0;t=\d+$`).MatchString(h.Get("RateLimit")) {
			t.Errorf("%s: RateLimit = %q, want \"user-orders\";r=0;t=<seconds>", source, h.Get("RateLimit"))
		}
		if got, want := h.Get("RateLimit-Policy"), `"user-orders";q=3;w=3600`; got != want {
			t.Errorf("%s: RateLimit-Policy = %q, want %q", source, got, want)
		}
		if h.Get("X-RateLimit-Remaining") != "0" || h.Get("X-RateLimit-Reset") == "" {
			t.Errorf("%s: X-RateLimit-Remaining %q Reset %q, want 0 and a reset", source, h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"))
		}
	}
	resp, err := svc.Client().Get(svc.URL + "/orders")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("RateLimit") != "" {
		t.Errorf("request without a user: %d, RateLimit %q; want 200 unchecked", resp.StatusCode, resp.Header.Get("RateLimit"))
	}
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	ip := client.ClientIP([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	for _, tt := range []struct {
		name, remote, xff, want string
	}{
		{"untrusted peer: its headers are ignored", "203.0.113.9:1234", "198.51.100.1", "203.0.113.9"},
		{"trusted peer: the client it forwarded", "10.0.0.2:1234", "198.51.100.1", "198.51.100.1"},
		{"trusted chain: the rightmost untrusted hop", "10.0.0.2:1234", "192.0.2.66, 198.51.100.1, 10.0.0.3", "198.51.100.1"},
		{"trusted peer without header", "10.0.0.2:1234", "", "10.0.0.2"},
		{"broken hop: nothing left of it believed", "10.0.0.2:1234", "198.51.100.1, garbage", "10.0.0.2"},
		{"IPv4-mapped peer", "[::ffff:203.0.113.9]:1234", "", "203.0.113.9"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tt.remote
			if tt.xff != "" {
				r.Header.Set("X-Forwarded-For", tt.xff)
			}
			if got := ip(r); got != tt.want {
				t.Errorf("ClientIP(%s, X-Forwarded-For %q) = %q, want %q", tt.remote, tt.xff, got, tt.want)
			}
		})
	}
}

// rpcUser checks calls of the user in the x-user header against /orders.
func rpcUser(_ context.Context, _ string, h http.Header) client.Request {
	if h.Get("X-User") == "" {
		return client.Request{}
	}
	return client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: h.Get("X-User")}}, Endpoint: "/orders"}
}

func retryDelay(t *testing.T, details []any) bool {
	t.Helper()
	for _, d := range details {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return true
		}
	}
	return false
}

// TestConnectInterceptor: a connect-go service answers 3 calls of a user, then
// ResourceExhausted with RetryInfo.
func TestConnectInterceptor(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	const procedure = "/test.v1.Echo/Ping"
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
		return connect.NewResponse(&emptypb.Empty{}), nil
	}, connect.WithInterceptors(c.ConnectInterceptor(rpcUser))))
	svc := httptest.NewServer(mux)
	defer svc.Close()
	ping := connect.NewClient[emptypb.Empty, emptypb.Empty](svc.Client(), svc.URL+procedure)
	u := user(t, "u")
	call := func() error {
		req := connect.NewRequest(&emptypb.Empty{})
		req.Header().Set("X-User", u)
		_, err := ping.CallUnary(context.Background(), req)
		return err
	}
	for i := 1; i <= 3; i++ {
		if err := call(); err != nil {
			t.Fatalf("call %d: %v, want served", i, err)
		}
	}
	err := call()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
		t.Fatalf("4th call: %v, want ResourceExhausted", err)
	}
	var details []any
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			t.Fatal(derr)
		}
		details = append(details, v)
	}
	if !retryDelay(t, details) {
		t.Errorf("4th call's details = %v, want a RetryInfo with a delay", details)
	}
	if ce.Meta().Get("Retry-After") == "" {
		t.Errorf("4th call's metadata has no Retry-After: %v", ce.Meta())
	}
}

// TestGRPCInterceptors: a grpc-go service answers 3 unary calls of a user, then
// ResourceExhausted with RetryInfo, and refuses the user's streams too.
func TestGRPCInterceptors(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Protocol: client.GRPC, Timeout: testTimeout})
	defer c.Close()
	gs := grpc.NewServer(grpc.UnaryInterceptor(c.UnaryServerInterceptor(rpcUser)), grpc.StreamInterceptor(c.StreamServerInterceptor(rpcUser)))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", user(t, "u"))
	for i := 1; i <= 3; i++ {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v, want served", i, err)
		}
	}
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"unary", func() error { _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); return err }},
		{"stream", func() error {
			st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}},
	} {
		st := status.Convert(tt.call())
		if st.Code() != codes.ResourceExhausted || !retryDelay(t, st.Details()) {
			t.Errorf("%s call over the limit: %v %v, want ResourceExhausted with a RetryInfo", tt.name, st.Code(), st.Details())
		}
	}
}

// TestMiddlewareFailMode: with the checker gone and FailClosed, the middleware answers 429 with
// Retry-After and X-RateLimit-Degraded, and no RateLimit fields (no limit of the checker's).
func TestMiddlewareFailMode(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	chk.stop()
	c := client.New(chk.url(), client.Config{FailMode: client.FailClosed, Retries: -1, ProbeInterval: 2 * time.Second})
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{APIKeyHeader: "X-Api-Key"})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })))
	defer svc.Close()
	req, _ := http.NewRequest(http.MethodGet, svc.URL+"/orders", nil)
	req.Header.Set("X-Api-Key", user(t, "key"))
	resp, err := svc.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusTooManyRequests || h.Get("Retry-After") != "2" || h.Get("X-RateLimit-Degraded") != "true" || h.Get("RateLimit") != "" {
		t.Errorf("checker down, fail closed: %d, Retry-After %q, X-RateLimit-Degraded %q, RateLimit %q; want 429, 2, true, none",
			resp.StatusCode, h.Get("Retry-After"), h.Get("X-RateLimit-Degraded"), h.Get("RateLimit"))
	}
}
