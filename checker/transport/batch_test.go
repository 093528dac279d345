package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/instance"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// batchFunc sends one CheckRateLimits call and returns its response, or its error's code.
type batchFunc func(t *testing.T, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, connect.Code, error)

// batchClients are CheckRateLimits over every stack of the port: connect-go's Connect, gRPC
// and gRPC-Web clients, grpc-go (served by grpc-go), and plain HTTP with a JSON body.
func batchClients(t *testing.T, env *testEnv) map[string]batchFunc {
	viaConnect := func(c quotaflowv1connect.RateLimiterClient) batchFunc {
		return func(t *testing.T, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, connect.Code, error) {
			resp, err := c.CheckRateLimits(context.Background(), connect.NewRequest(req))
			if err != nil {
				return nil, connect.CodeOf(err), err
			}
			return resp.Msg, 0, nil
		}
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(env.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	gc := quotaflowv1.NewRateLimiterClient(conn)
	return map[string]batchFunc{
		"connect": viaConnect(env.client("connect")),
		"grpc":    viaConnect(quotaflowv1connect.NewRateLimiterClient(h2cClient(), env.url, connect.WithGRPC())),
		"grpcweb": viaConnect(env.client("grpcweb")),
		"grpc-go": func(t *testing.T, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, connect.Code, error) {
			resp, err := gc.CheckRateLimits(context.Background(), req)
			if err != nil {
				return nil, connect.Code(status.Code(err)), err
			}
			return resp, 0, nil
		},
		"json": func(t *testing.T, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, connect.Code, error) {
			body, err := protojson.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			hr, err := env.http.Post(env.url+quotaflowv1connect.RateLimiterCheckRateLimitsProcedure, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer hr.Body.Close()
			b, _ := io.ReadAll(hr.Body)
			if hr.StatusCode != http.StatusOK {
				var e struct{ Code, Message string }
				if err := json.Unmarshal(b, &e); err != nil {
					t.Fatalf("HTTP %d with body %q: %v", hr.StatusCode, b, err)
				}
				var code connect.Code
				if err := code.UnmarshalText([]byte(e.Code)); err != nil {
					t.Fatalf("HTTP %d with code %q: %v", hr.StatusCode, e.Code, err)
				}
				return nil, code, fmt.Errorf("%s: %s", e.Code, e.Message)
			}
			resp := new(quotaflowv1.CheckRateLimitsResponse)
			if err := protojson.Unmarshal(b, resp); err != nil {
				t.Fatalf("body %q: %v", b, err)
			}
			return resp, 0, nil
		},
	}
}

// batchID is id made unique to the run as well: unlike the package's other tests, the batch
// tests pass under -count=N on one Redis.
func batchID(t *testing.T, name string) string { return id(t, name) + "-" + instance.NewID() }

func userCheck(user, endpoint string, cost int64) *quotaflowv1.CheckRateLimitRequest {
	return &quotaflowv1.CheckRateLimitRequest{Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint, Cost: cost}
}

// TestCheckRateLimits: over every protocol, a batch's checks are decided independently (a
// denial and invalid checks beside allowed ones), each all-or-nothing, each with its own answer.
func TestCheckRateLimits(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for name, batch := range batchClients(t, env) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			full, free, multi, ip := batchID(t, "full"), batchID(t, "free"), batchID(t, "multi"), batchID(t, "ip")
			// Fill full's /orders limit (5), and ip's ip-api limit (2) to 1 of 2.
			resp, code, err := batch(t, &quotaflowv1.CheckRateLimitsRequest{Checks: []*quotaflowv1.CheckRateLimitRequest{
				userCheck(full, "/orders", 5),
				{Identifier: ip, Dimension: quotaflowv1.Dimension_DIMENSION_IP, Endpoint: "/api/x"},
			}})
			if err != nil {
				t.Fatalf("first batch: %v (%s)", err, code)
			}
			for i, r := range resp.Results {
				if !r.GetResponse().GetAllowed() {
					t.Fatalf("first batch result %d = %v, want allowed", i, r)
				}
			}
			multiCheck := userCheck(multi, "/api/x", 2)
			multiCheck.Subjects = []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: ip}}
			resp, code, err = batch(t, &quotaflowv1.CheckRateLimitsRequest{Checks: []*quotaflowv1.CheckRateLimitRequest{
				userCheck(full, "/orders", 1),
				userCheck(free, "/orders", 1),
				{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders"},
				userCheck(free, "/orders", 1_000_001),
				multiCheck, // ip has 1 of 2 left: the user's cost 2 is denied, and charges neither
				{Identifier: free, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders", Tier: "nope"},
			}})
			if err != nil {
				t.Fatalf("second batch: %v (%s)", err, code)
			}
			if len(resp.Results) != 6 {
				t.Fatalf("got %d results, want 6", len(resp.Results))
			}
			if got := resp.Results[0].GetResponse(); got == nil || got.Allowed || got.RetryAfter < 1 || got.RuleId != "user-orders" {
				t.Errorf("checks[0] (limit spent) = %v, want denied by user-orders with retry_after", resp.Results[0])
			}
			if got := resp.Results[1].GetResponse(); got == nil || !got.Allowed || got.Remaining != 4 {
				t.Errorf("checks[1] (fresh user) = %v, want allowed with 4 left", resp.Results[1])
			}
			for _, tt := range []struct {
				i     int
				field string
			}{{2, "checks[2].identifier"}, {3, "checks[3].cost"}, {5, "checks[5].tier"}} {
				e := resp.Results[tt.i].GetError()
				if e == nil || connect.Code(e.Code) != connect.CodeInvalidArgument || e.Field != tt.field || !strings.HasPrefix(e.Message, tt.field+": ") {
					t.Errorf("checks[%d] = %v, want InvalidArgument naming %s", tt.i, resp.Results[tt.i], tt.field)
				}
			}
			if got := resp.Results[4].GetResponse(); got == nil || got.Allowed || got.RuleId != "ip-api" {
				t.Errorf("checks[4] (ip over its limit) = %v, want denied by ip-api", resp.Results[4])
			}
			// All-or-nothing within checks[4]: the user was not charged, and the ip still has 1.
			resp, _, err = batch(t, &quotaflowv1.CheckRateLimitsRequest{Checks: []*quotaflowv1.CheckRateLimitRequest{
				userCheck(multi, "/api/x", 4),
				{Identifier: ip, Dimension: quotaflowv1.Dimension_DIMENSION_IP, Endpoint: "/api/x"},
			}})
			if err != nil {
				t.Fatalf("third batch: %v", err)
			}
			if got := resp.Results[0].GetResponse(); !got.GetAllowed() || got.GetRemaining() != 0 {
				t.Errorf("user after the denied check = %v, want its whole burst of 4 allowed", resp.Results[0])
			}
			if got := resp.Results[1].GetResponse(); !got.GetAllowed() || got.GetRemaining() != 0 {
				t.Errorf("ip after the denied check = %v, want its last unit allowed", resp.Results[1])
			}
		})
	}
}

// TestCheckRateLimitsBounds: a batch over MaxBatchChecks is refused whole, naming the first
// check beyond; an empty batch has no results; the batch needs the check permission.
func TestCheckRateLimitsBounds(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	over := make([]*quotaflowv1.CheckRateLimitRequest, MaxBatchChecks+1)
	for i := range over {
		over[i] = userCheck(batchID(t, "u"), "/orders", 1)
	}
	for name, batch := range batchClients(t, env) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, code, err := batch(t, &quotaflowv1.CheckRateLimitsRequest{Checks: over})
			if code != connect.CodeInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("checks[%d]", MaxBatchChecks)) {
				t.Errorf("%d checks: %v (%s), want InvalidArgument naming checks[%d]", len(over), err, code, MaxBatchChecks)
			}
			resp, _, err := batch(t, &quotaflowv1.CheckRateLimitsRequest{})
			if err != nil || len(resp.Results) != 0 {
				t.Errorf("empty batch = %v, %v, want no results", resp, err)
			}
		})
	}
	t.Run("no check permission", func(t *testing.T) {
		t.Parallel()
		callers := new(auth.Registry)
		if err := callers.Load([]byte("anonymous: {permissions: []}\n")); err != nil {
			t.Fatal(err)
		}
		env := newEnvWith(t, checker.Config{}, Config{Callers: callers})
		_, err := env.client("connect").CheckRateLimits(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitsRequest{
			Checks: []*quotaflowv1.CheckRateLimitRequest{userCheck(batchID(t, "u"), "/orders", 1)}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("anonymous without check: %v, want PermissionDenied", err)
		}
	})
	t.Run("tier without assert-tier", func(t *testing.T) {
		t.Parallel()
		env := newEnvWith(t, checker.Config{}, Config{})
		req := userCheck(batchID(t, "u"), "/orders", 1)
		req.Tier = "premium"
		resp, err := env.client("connect").CheckRateLimits(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitsRequest{
			Checks: []*quotaflowv1.CheckRateLimitRequest{userCheck(batchID(t, "v"), "/orders", 1), req}}))
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Msg.Results[0].GetResponse().GetAllowed() {
			t.Errorf("checks[0] = %v, want allowed", resp.Msg.Results[0])
		}
		if e := resp.Msg.Results[1].GetError(); connect.Code(e.GetCode()) != connect.CodePermissionDenied || e.GetField() != "checks[1].tier" {
			t.Errorf("checks[1] = %v, want PermissionDenied naming checks[1].tier", resp.Msg.Results[1])
		}
	})
}
