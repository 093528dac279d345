package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/quotaflow/quotaflow/checker/client"
)

// paced is the queue of the tests' rule user-paced: a slot every 100 ms.
const paced = 100 * time.Millisecond

// TestMiddlewareDelay: requests that a rule with on_limit: delay queued reach the handler at
// their slots, one every 100 ms, never before: 5 concurrent requests of one user are served
// over 400 ms at least, each answered 200.
func TestMiddlewareDelay(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	var mu sync.Mutex
	var served []time.Time
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served = append(served, time.Now())
		mu.Unlock()
	})))
	defer svc.Close()
	u := user(t, "u")
	start := time.Now() // before every decision
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, svc.URL+"/paced", nil)
			req.Header.Set("X-User", u)
			resp, err := svc.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("queued request: %d, want 200 at its slot", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(served, time.Time.Compare)
	// The k-th request served comes k slots after the first decision at the earliest (the
	// delays are rounded up to the ms: never early).
	var worst time.Duration
	for k, at := range served {
		if early := start.Add(time.Duration(k) * paced).Sub(at); early > 0 {
			t.Errorf("request %d served %v before its slot", k+1, early)
		}
		if k > 0 {
			worst = max(worst, (at.Sub(served[k-1]) - paced).Abs())
		}
	}
	t.Logf("served %v apart at most from the 100ms spacing", worst)
}

// TestInterceptorsDelay: the Connect and gRPC interceptors hold a queued call until its slot:
// of two calls in a row, the second is served 100 ms after the first's decision at the
// earliest.
func TestInterceptorsDelay(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	pacedUser := func(_ context.Context, _ string, h http.Header) client.Request {
		return client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: h.Get("X-User")}}, Endpoint: "/paced"}
	}
	twice := func(t *testing.T, call func() error) {
		t.Helper()
		start := time.Now()
		for i := range 2 {
			if err := call(); err != nil {
				t.Fatalf("call %d: %v, want served", i+1, err)
			}
		}
		if took := time.Since(start); took < paced {
			t.Errorf("two calls served in %v, want the second at its slot, %v after the first", took, paced)
		}
	}
	t.Run("connect", func(t *testing.T) {
		c := client.New(chk.url(), client.Config{Timeout: testTimeout})
		defer c.Close()
		const procedure = "/test.v1.Echo/Ping"
		mux := http.NewServeMux()
		mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
			return connect.NewResponse(&emptypb.Empty{}), nil
		}, connect.WithInterceptors(c.ConnectInterceptor(pacedUser))))
		svc := httptest.NewServer(mux)
		defer svc.Close()
		ping := connect.NewClient[emptypb.Empty, emptypb.Empty](svc.Client(), svc.URL+procedure)
		u := user(t, "u")
		twice(t, func() error {
			req := connect.NewRequest(&emptypb.Empty{})
			req.Header().Set("X-User", u)
			_, err := ping.CallUnary(context.Background(), req)
			return err
		})
	})
	t.Run("grpc", func(t *testing.T) {
		c := client.New(chk.url(), client.Config{Protocol: client.GRPC, Timeout: testTimeout})
		defer c.Close()
		gs := grpc.NewServer(grpc.UnaryInterceptor(c.UnaryServerInterceptor(pacedUser)))
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
		twice(t, func() error { _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); return err })
	})
}
