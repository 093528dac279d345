package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// fakeChecker answers every protocol without Redis: subjects whose identifier starts with
// "deny-" are denied, all others allowed. It keeps the last request of each protocol, so that
// tests can see what the generator sent.
type fakeChecker struct {
	mu      sync.Mutex
	check   *quotaflowv1.CheckRateLimitRequest // last of Connect or gRPC
	batches []int                              // sizes of the CheckRateLimits calls
	rls     *ratelimitv3.RateLimitRequest
}

// decideBatch answers a CheckRateLimits: subjects starting with "err-" get an error.
func (f *fakeChecker) decideBatch(req *quotaflowv1.CheckRateLimitsRequest) *quotaflowv1.CheckRateLimitsResponse {
	f.mu.Lock()
	f.batches = append(f.batches, len(req.GetChecks()))
	f.mu.Unlock()
	resp := &quotaflowv1.CheckRateLimitsResponse{}
	for _, c := range req.GetChecks() {
		r := &quotaflowv1.CheckRateLimitsResult{}
		if strings.HasPrefix(c.GetIdentifier(), "err-") {
			r.Result = &quotaflowv1.CheckRateLimitsResult_Error{Error: &quotaflowv1.CheckError{Code: 3, Message: "no such subject"}}
		} else {
			r.Result = &quotaflowv1.CheckRateLimitsResult_Response{Response: f.decide(c)}
		}
		resp.Results = append(resp.Results, r)
	}
	return resp
}

func (f *fakeChecker) decide(req *quotaflowv1.CheckRateLimitRequest) *quotaflowv1.CheckRateLimitResponse {
	f.mu.Lock()
	f.check = req
	f.mu.Unlock()
	return &quotaflowv1.CheckRateLimitResponse{Allowed: !strings.HasPrefix(req.GetIdentifier(), "deny-")}
}

// The fake's three services: each API has its own Unimplemented type to embed.
type (
	connectHandler struct {
		quotaflowv1connect.UnimplementedRateLimiterHandler
		*fakeChecker
	}
	grpcServer struct {
		quotaflowv1.UnimplementedRateLimiterServer
		*fakeChecker
	}
	rlsServer struct {
		ratelimitv3.UnimplementedRateLimitServiceServer
		*fakeChecker
	}
)

func (h connectHandler) CheckRateLimit(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitRequest]) (*connect.Response[quotaflowv1.CheckRateLimitResponse], error) {
	return connect.NewResponse(h.decide(req.Msg)), nil
}

func (h connectHandler) CheckRateLimits(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitsRequest]) (*connect.Response[quotaflowv1.CheckRateLimitsResponse], error) {
	return connect.NewResponse(h.decideBatch(req.Msg)), nil
}

func (g grpcServer) CheckRateLimits(ctx context.Context, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, error) {
	return g.decideBatch(req), nil
}

func (g grpcServer) CheckRateLimit(ctx context.Context, req *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	return g.decide(req), nil
}

func (r rlsServer) ShouldRateLimit(ctx context.Context, req *ratelimitv3.RateLimitRequest) (*ratelimitv3.RateLimitResponse, error) {
	r.mu.Lock()
	r.rls = req
	r.mu.Unlock()
	code := ratelimitv3.RateLimitResponse_OK
	if strings.HasPrefix(req.GetDescriptors()[0].GetEntries()[0].GetValue(), "deny-") {
		code = ratelimitv3.RateLimitResponse_OVER_LIMIT
	}
	return &ratelimitv3.RateLimitResponse{OverallCode: code}, nil
}

// startFake serves f: Connect on the first URL, grpc-go's gRPC and RLS on the second.
func startFake(t *testing.T, f *fakeChecker) (connectURL, grpcURL string) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(quotaflowv1connect.NewRateLimiterHandler(connectHandler{fakeChecker: f}))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	quotaflowv1.RegisterRateLimiterServer(gs, grpcServer{fakeChecker: f})
	ratelimitv3.RegisterRateLimitServiceServer(gs, rlsServer{fakeChecker: f})
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return hs.URL, "http://" + ln.Addr().String()
}

func TestRun(t *testing.T) {
	t.Parallel()
	f := &fakeChecker{}
	connectURL, grpcURL := startFake(t, f)
	tests := []struct {
		name        string
		cfg         Config
		wantAllowed bool
	}{
		{"connect closed", Config{Target: connectURL, Concurrency: 4, KeyPrefix: "ok-"}, true},
		{"connect open denied", Config{Target: connectURL, Rate: 200, KeyPrefix: "deny-", Dimension: DimensionIP}, false},
		{"grpc closed zipf", Config{Target: grpcURL, Protocol: ProtocolGRPC, Concurrency: 4, Distribution: DistributionZipf}, true},
		{"grpc open denied", Config{Target: grpcURL + "/", Protocol: ProtocolGRPC, Rate: 200, KeyPrefix: "deny-"}, false},
		{"rls closed hot", Config{Target: grpcURL, Protocol: ProtocolRLS, Concurrency: 4, Distribution: DistributionHot, Domain: "d"}, true},
		{"rls open denied", Config{Target: grpcURL, Protocol: ProtocolRLS, Rate: 200, KeyPrefix: "deny-", Dimension: DimensionAPIKey}, false},
		{"connect batch closed", Config{Target: connectURL, Concurrency: 2, Batch: 8, KeyPrefix: "ok-"}, true},
		{"grpc batch open denied", Config{Target: grpcURL, Protocol: ProtocolGRPC, Rate: 200, Batch: 4, KeyPrefix: "deny-"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Duration = 500 * time.Millisecond
			rep, err := Run(context.Background(), tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Checks == 0 || rep.Errors != 0 || rep.Allowed+rep.Denied != rep.Checks || rep.Interrupted {
				t.Errorf("report %+v: want checks, all answered, not interrupted", rep)
			}
			if (tt.wantAllowed && rep.Denied != 0) || (!tt.wantAllowed && rep.Allowed != 0) {
				t.Errorf("allowed %d, denied %d: want all allowed = %v", rep.Allowed, rep.Denied, tt.wantAllowed)
			}
			if tt.cfg.Rate > 0 {
				if n := rep.Checks + rep.Missed; rep.Mode != "open" || n < 99 || n > 101 {
					t.Errorf("open loop: mode %q, %d checks + %d missed, want the 100 scheduled", rep.Mode, rep.Checks, rep.Missed)
				}
			} else if rep.Mode != "closed" {
				t.Errorf("mode %q, want closed", rep.Mode)
			}
		})
	}
	// The batch configs sent batches of their size, and only those.
	for _, n := range f.batches {
		if n != 4 && n != 8 {
			t.Errorf("a CheckRateLimits of %d checks; want 4 or 8", n)
		}
	}
	if len(f.batches) == 0 {
		t.Error("no CheckRateLimits: want the batch configs to send them")
	}
	// The last requests carry what the configs asked for, with the defaults filled in.
	if c := f.check; c.GetEndpoint() != "/api/v1/orders" || !strings.HasPrefix(c.GetIdentifier(), "deny-") {
		t.Errorf("last check %v: want endpoint /api/v1/orders and a deny- subject", c)
	}
	if r := f.rls; r.GetDomain() != "" || r.GetDescriptors()[0].GetEntries()[0].GetKey() != "api_key" ||
		r.GetDescriptors()[0].GetEntries()[1].GetValue() != "/api/v1/orders" {
		t.Errorf("last RLS request %v: want no domain, api_key and path entries", r)
	}
}

// TestRunDefaults: a Config with only a target and a duration runs with the documented
// defaults, and its reports print.
func TestRunDefaults(t *testing.T) {
	t.Parallel()
	connectURL, _ := startFake(t, &fakeChecker{})
	var progress bytes.Buffer
	rep, err := Run(context.Background(), Config{Target: connectURL, Duration: 1500 * time.Millisecond, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Protocol != "connect" || rep.Mode != "closed" || rep.Concurrency != 64 || rep.Keys != 10000 || rep.Distribution != "uniform" {
		t.Errorf("report %+v: want connect, closed, 64 workers, 10000 uniform keys", rep)
	}
	if !strings.HasPrefix(progress.String(), "bench     1s ") {
		t.Errorf("progress %q: want a line after a second", progress.String())
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"quotaflow bench: connect to " + connectURL + " for 1.5s, closed loop with 64 workers\n", "  10000 user subjects (uniform) on /api/v1/orders\n", "errors      0\n"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report %q: want %q", text.String(), want)
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	dec := json.NewDecoder(&js)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&back); err != nil || back.Checks != rep.Checks || back.P99Ms != rep.P99Ms {
		t.Errorf("JSON report decodes to %+v (%v), want %+v", back, err, rep)
	}
}

// TestRunStops: a run ends soon after its context, with what it measured.
func TestRunStops(t *testing.T) {
	t.Parallel()
	connectURL, _ := startFake(t, &fakeChecker{})
	for _, rate := range []float64{0, 50} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		rep, err := Run(ctx, Config{Target: connectURL, Duration: time.Hour, Rate: rate, Concurrency: 2})
		cancel()
		if err != nil || time.Since(start) > 5*time.Second {
			t.Fatalf("rate %v: %v after %s, want nil soon after the deadline", rate, err, time.Since(start))
		}
		if !rep.Interrupted || rep.Checks == 0 || rep.Errors != 0 || rep.Missed != 0 {
			t.Errorf("rate %v: report %+v: want interrupted, some checks, no errors or missed", rate, rep)
		}
	}
}

func TestRunConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg   Config
		field string
	}{
		{Config{Protocol: "smoke"}, "Protocol"},
		{Config{Concurrency: -1}, "Concurrency"},
		{Config{Concurrency: MaxConcurrency + 1}, "Concurrency"},
		{Config{Rate: -1}, "Rate"},
		{Config{Duration: -time.Second}, "Duration"},
		{Config{Warmup: -time.Second}, "Warmup"},
		{Config{Timeout: -time.Second}, "Timeout"},
		{Config{Keys: MaxKeys + 1}, "Keys"},
		{Config{Batch: -1}, "Batch"},
		{Config{Batch: MaxBatch + 1}, "Batch"},
		{Config{Batch: 2, Protocol: ProtocolRLS}, "Batch"},
		{Config{Endpoint: "api"}, "Endpoint"},
		{Config{Distribution: "pareto"}, "Distribution"},
		{Config{Dimension: "global"}, "Dimension"},
		{Config{Target: "localhost:8080"}, "Target"},
	}
	for _, tt := range tests {
		rep, err := Run(context.Background(), tt.cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field || rep != nil {
			t.Errorf("Run(%+v) = %v, %v; want a *ConfigError for %s", tt.cfg, rep, err, tt.field)
		}
	}
}

// TestRunBatchErrors: a check of a batch that gets an error counts as one error, the others
// of its batch as answered.
func TestRunBatchErrors(t *testing.T) {
	t.Parallel()
	_, grpcURL := startFake(t, &fakeChecker{})
	rep, err := Run(context.Background(), Config{Target: grpcURL, Protocol: ProtocolGRPC, Concurrency: 1, Batch: 10,
		Keys: 1, KeyPrefix: "err-", Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors == 0 || rep.Errors%10 != 0 || rep.Allowed+rep.Denied != 0 || len(rep.ErrorSamples) != 1 ||
		!strings.Contains(rep.ErrorSamples[0], "no such subject") {
		t.Errorf("report %+v: want every check an error, in tens, with the check's message", rep)
	}
}
