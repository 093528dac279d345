package transport

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaflow/quotaflow/checker"
)

func getForwardAuth(t *testing.T, env *testEnv, headers map[string]string, query string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, env.url+"/ratelimit/check"+query, nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := env.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", b, err)
	}
	return resp, body
}

func TestForwardAuth(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	headers := map[string]string{"X-User-Id": id(t, "u"), "X-Client-Ip": testIP(t, "client"), "X-Forwarded-Uri": "/api/v1/items?page=2"}
	resp, body := getForwardAuth(t, env, headers, "")
	if resp.StatusCode != http.StatusOK || body["allowed"] != true || body["retry_after"] != nil {
		t.Fatalf("first call = %d %v, want 200 allowed with retry_after null", resp.StatusCode, body)
	}
	// ip-api (limit 2) is the most used: 1 of 2.
	h := resp.Header
	if h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != "1" || h.Get("X-RateLimit-Reset") == "" {
		t.Errorf("X-RateLimit-* = %s/%s/%s, want 2/1/<reset>", h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"))
	}
	if !regexp.MustCompile(`^"ip-api";r=1;t=\d+$`).MatchString(h.Get("RateLimit")) {
		t.Errorf("RateLimit = %q, want \"ip-api\";r=1;t=<seconds>", h.Get("RateLimit"))
	}
	policy := h.Get("RateLimit-Policy")
	for _, want := range []string{`"user-api";q=10;w=3600;burst=4`, `"ip-api";q=2;w=3600`} {
		if !strings.Contains(policy, want) {
			t.Errorf("RateLimit-Policy = %q, want it to list %s", policy, want)
		}
	}
	getForwardAuth(t, env, headers, "")
	resp, body = getForwardAuth(t, env, headers, "")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third call = %d, want 429", resp.StatusCode)
	}
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 {
		t.Errorf("Retry-After = %q, want whole seconds >= 1", resp.Header.Get("Retry-After"))
	}
	wantMsg := "Too many requests. Please retry after " + strconv.Itoa(retry) + " seconds."
	if body["error"] != "rate_limit_exceeded" || body["message"] != wantMsg || body["allowed"] != false || body["retry_after"] != float64(retry) {
		t.Errorf("429 body = %v, want error rate_limit_exceeded, message %q, retry_after %d", body, wantMsg, retry)
	}
	if resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("X-RateLimit-Remaining = %q on 429, want 0", resp.Header.Get("X-RateLimit-Remaining"))
	}
}

func TestForwardAuthInputs(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	tests := []struct {
		name    string
		headers map[string]string
		query   string
		status  int
		want    string
	}{
		{"original uri and forwarded-for", map[string]string{"X-Forwarded-For": testIP(t, "hop") + ", " + testIP(t, "client"), "X-Original-URI": "/api/a"}, "", 200, ""},
		{"endpoint from query", map[string]string{"X-Api-Key": id(t, "key"), "X-Real-Ip": testIP(t, "real")}, "?endpoint=/api/b&cost=2", 200, ""},
		// The client IP is always known (the connection's, else what a trusted proxy forwards),
		// so a request always names a subject.
		{"the connection is the subject", map[string]string{"X-Forwarded-Uri": "/free"}, "", 200, ""},
		{"no endpoint", map[string]string{"X-User-Id": "u"}, "", 400, "endpoint: required"},
		{"bad cost", map[string]string{"X-User-Id": "u", "X-RateLimit-Cost": "lots"}, "?endpoint=/a", 400, `cost: want a whole number, got "lots"`},
		{"negative cost", map[string]string{"X-User-Id": "u"}, "?endpoint=/a&cost=-3", 400, "cost: must not be negative"},
		{"invalid utf-8", map[string]string{"X-User-Id": "\xff"}, "?endpoint=/a", 400, "X-User-Id: must be valid UTF-8"},
		{"unknown tier", map[string]string{"X-User-Id": "u"}, "?endpoint=/a&tier=gold", 400, `tier: "gold" is not a configured tier`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := getForwardAuth(t, env, tt.headers, tt.query)
			if resp.StatusCode != tt.status {
				t.Fatalf("status = %d (%v), want %d", resp.StatusCode, body, tt.status)
			}
			if tt.want != "" && (body["error"] != "invalid_argument" || !strings.Contains(body["message"].(string), tt.want)) {
				t.Errorf("body = %v, want invalid_argument containing %q", body, tt.want)
			}
		})
	}
}

func TestHealthEndpoints(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		resp, err := env.http.Get(env.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	// Without rules the process is up but not ready, and checks are Unavailable.
	rdb := redisSrv.UniversalClient()
	defer rdb.Close()
	engine := checker.New(checker.Config{Redis: rdb, RedisTimeout: loadedTimeout})
	defer engine.Close()
	if err := engine.Ready(context.Background()); err == nil {
		t.Error("Ready without rules = nil, want an error")
	}
	empty := New(engine, Config{})
	_, err := empty.CheckRateLimit(context.Background(), checkReq("a", "/x"))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("check without rules: %v, want Unavailable", err)
	}

	hc := healthClient(env.url)
	for _, svc := range []string{"", "quotaflow.v1.RateLimiter"} {
		resp, err := hc.CallUnary(context.Background(), connect.NewRequest(&healthpb.HealthCheckRequest{Service: svc}))
		if err != nil || resp.Msg.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("grpc health %q = %v, %v, want SERVING", svc, resp, err)
		}
	}
	_, err = hc.CallUnary(context.Background(), connect.NewRequest(&healthpb.HealthCheckRequest{Service: "nope"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("grpc health of an unknown service: %v, want NotFound", err)
	}
}

// TestHealthWatch: Watch sends the status at once, on both stacks: grpc-go (a gRPC client on
// h2c) and connect-go (gRPC-Web over HTTP/1.1).
func TestHealthWatch(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn, err := grpc.NewClient(strings.TrimPrefix(env.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gs, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := gs.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc-go Watch: first message %v, %v, want SERVING", resp, err)
	}

	web := connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](
		env.http, env.url+healthWatchProcedure, connect.WithGRPCWeb())
	ws, err := web.CallServerStream(ctx, connect.NewRequest(&healthpb.HealthCheckRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if !ws.Receive() || ws.Msg().GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC-Web Watch: first message %v, %v, want SERVING", ws.Msg(), ws.Err())
	}
}

// TestReflection: grpcurl and other tools can list and describe the services without protos.
func TestReflection(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	client := grpcreflect.NewClient(h2cClient(), env.url)
	stream := client.NewStream(context.Background())
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range names {
		got = append(got, string(n))
	}
	for _, want := range []string{"quotaflow.v1.RateLimiter", "grpc.health.v1.Health"} {
		if !slices.Contains(got, want) {
			t.Errorf("services = %v, want %s", got, want)
		}
	}
	files, err := stream.FileContainingSymbol("quotaflow.v1.CheckRateLimitRequest")
	if err != nil || len(files) == 0 {
		t.Errorf("FileContainingSymbol = %v, %v, want the ratelimit.proto descriptor", files, err)
	}
}
