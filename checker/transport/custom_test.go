package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestCustomDimensionEveryProtocol counts a custom dimension (dimension: tenant) over every
// way a check comes in: Connect, gRPC, gRPC-Web, HTTP/JSON, forward-auth's configured header
// and an RLS entry. Each names its own tenant, holding the bytes keys are made of: two checks
// are allowed and the third denied by the tenant's rule, whose status names the descriptor.
func TestCustomDimensionEveryProtocol(t *testing.T) {
	t.Parallel()
	callers := callersOf(t, "anonymous: {permissions: [check]}\n")
	env := newEnvWith(t, checker.Config{Rules: mustRules(t, `
rules:
  - {id: per-tenant, dimension: tenant, endpoint: "/t/*", algorithm: fixed_window, limit: 2, window: 1h}
  - {id: per-user, dimension: user, endpoint: "/t/*", algorithm: fixed_window, limit: 100, window: 1h}
`)}, Config{Callers: callers, ForwardAuth: ForwardAuthConfig{
		TrustedProxies:   []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		DimensionHeaders: []DimensionHeader{{Dimension: "tenant", Header: "X-Tenant-Id"}},
	}})
	// Parallel subtests run after this function returns: each call has its own deadline.
	callCtx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	rls := grpcRLSClient(t, strings.TrimPrefix(env.url, "http://"))
	viaRPC := func(protocol string) func(tenant string) (bool, string, string) {
		c := env.client(protocol)
		return func(tenant string) (bool, string, string) {
			resp, err := c.CheckRateLimit(callCtx(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Endpoint: "/t/x", Subjects: []*quotaflowv1.Subject{
					{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "u-" + protocol},
					{CustomDimension: "tenant", Identifier: tenant},
				}}))
			if err != nil {
				t.Fatalf("%s: %v", protocol, err)
			}
			return deciding(resp.Msg)
		}
	}
	protocols := map[string]func(tenant string) (bool, string, string){
		"connect": viaRPC("connect"),
		"grpc":    viaRPC("grpc"),
		"grpcweb": viaRPC("grpcweb"),
		"json": func(tenant string) (bool, string, string) {
			body, _ := json.Marshal(map[string]any{"endpoint": "/t/x", "subjects": []map[string]string{{"customDimension": "tenant", "identifier": tenant}}})
			resp, err := env.http.Post(env.url+"/quotaflow.v1.RateLimiter/CheckRateLimit", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("json: %d %s", resp.StatusCode, b)
			}
			var m quotaflowv1.CheckRateLimitResponse
			if err := protojson.Unmarshal(b, &m); err != nil {
				t.Fatalf("json: %v: %s", err, b)
			}
			return deciding(&m)
		},
		"forward-auth": func(tenant string) (bool, string, string) {
			resp, body := getForwardAuth(t, env, map[string]string{"X-Tenant-Id": tenant, "X-Forwarded-Uri": "/t/x"}, "")
			rule, _ := body["rule_id"].(string)
			return resp.StatusCode == http.StatusOK, rule, ""
		},
		"rls": func(tenant string) (bool, string, string) {
			resp, err := rls.ShouldRateLimit(callCtx(), rlsReq(desc("path", "/t/x", "tenant", tenant)))
			if err != nil {
				t.Fatalf("rls: %v", err)
			}
			st := resp.GetStatuses()[0]
			return resp.GetOverallCode() == ratelimitv3.RateLimitResponse_OK, st.GetCurrentLimit().GetName(), ""
		},
	}
	for name, check := range protocols {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tenant := id(t, "{acme}:"+name)
			for i, want := range []bool{true, true, false} {
				allowed, rule, subject := check(tenant)
				if allowed != want || !want && rule != "per-tenant" {
					t.Errorf("check %d: allowed %v by rule %q, want %v (denied by per-tenant)", i, allowed, rule, want)
				}
				if subject != "" && !want && subject != "tenant="+tenant {
					t.Errorf("check %d: denying subject %q, want the descriptor tenant=%s", i, subject, tenant)
				}
			}
		})
	}
}

// deciding is a response's allowed, and its deciding limit's rule and (a descriptor's) subject.
func deciding(r *quotaflowv1.CheckRateLimitResponse) (bool, string, string) {
	for _, l := range r.GetLimits() {
		if !l.GetAllowed() {
			if l.GetDimension() != quotaflowv1.Dimension_DIMENSION_DESCRIPTOR {
				return r.GetAllowed(), l.GetRuleId(), "not a descriptor: " + l.GetDimension().String()
			}
			return r.GetAllowed(), l.GetRuleId(), l.GetIdentifier()
		}
	}
	return r.GetAllowed(), "", ""
}

func TestCustomDimensionInvalid(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	long := strings.Repeat("x", 257)
	tests := []struct {
		name string
		subs []*quotaflowv1.Subject
		want string
	}{
		{"with a dimension", []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, CustomDimension: "tenant", Identifier: "a"}}, "subjects[0].dimension: DIMENSION_USER with a custom_dimension"},
		{"descriptor without a name", []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_DESCRIPTOR, Identifier: "a"}}, "subjects[0].custom_dimension: required with DIMENSION_DESCRIPTOR"},
		{"no value", []*quotaflowv1.Subject{{CustomDimension: "tenant"}}, "subjects[0].identifier"},
		{"long name", []*quotaflowv1.Subject{{CustomDimension: long, Identifier: "a"}}, "subjects[0].custom_dimension: must be at most 256 bytes"},
		{"long value", []*quotaflowv1.Subject{{CustomDimension: "tenant", Identifier: long}}, "subjects[0].identifier: must be at most 256 bytes"},
		{"too many", manyCustom(17), "subjects[16].custom_dimension: at most 16 custom dimensions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/x", Subjects: tt.subs}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
}

// TestCustomDimensionReset resets a custom dimension's value through ResetLimit.
func TestCustomDimensionReset(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, `
rules:
  - {id: per-tenant, dimension: tenant, endpoint: "/t/*", algorithm: fixed_window, limit: 1, window: 1h}
  - {id: per-region, dimension: region, endpoint: "/t/*", algorithm: fixed_window, limit: 1, window: 1h}
`)})
	c := env.client("connect")
	tenant := id(t, "t")
	check := func() bool {
		t.Helper()
		resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
			Endpoint: "/t/x", Subjects: []*quotaflowv1.Subject{{CustomDimension: "tenant", Identifier: tenant}}}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Allowed
	}
	if !check() || check() {
		t.Fatal("want the first check allowed and the second denied")
	}
	resp, err := c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{CustomDimension: "tenant", Identifier: tenant}))
	if err != nil || resp.Msg.ResetCount != 1 || len(resp.Msg.RuleIds) != 1 || resp.Msg.RuleIds[0] != "per-tenant" {
		t.Fatalf("reset: %v, %v; want 1 bucket of per-tenant", resp, err)
	}
	if !check() {
		t.Error("after the reset: denied, want allowed")
	}
	_, err = c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{CustomDimension: "tenant", Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: tenant}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "dimension: DIMENSION_IP with a custom_dimension") {
		t.Errorf("reset with a dimension and a custom_dimension: %v, want InvalidArgument naming dimension", err)
	}
}

// manyCustom is n subjects of n custom dimensions.
func manyCustom(n int) []*quotaflowv1.Subject {
	subs := make([]*quotaflowv1.Subject, n)
	for i := range subs {
		subs[i] = &quotaflowv1.Subject{CustomDimension: fmt.Sprintf("d%d", i), Identifier: "v"}
	}
	return subs
}

// TestForwardAuthCustomDimensionInvalid: a custom dimension's header past the identifier bound
// is a 400 naming the header, not a check of a truncated or other value.
func TestForwardAuthCustomDimensionInvalid(t *testing.T) {
	t.Parallel()
	env := newEnvWith(t, checker.Config{}, Config{ForwardAuth: ForwardAuthConfig{
		DimensionHeaders: []DimensionHeader{{Dimension: "tenant", Header: "X-Tenant-Id"}}}})
	resp, body := getForwardAuth(t, env, map[string]string{"X-Tenant-Id": strings.Repeat("t", 257), "X-Forwarded-Uri": "/t/x"}, "")
	if msg, _ := body["message"].(string); resp.StatusCode != http.StatusBadRequest || !strings.Contains(msg, "X-Tenant-Id: must be at most 256 bytes") {
		t.Errorf("got %d %v, want 400 naming X-Tenant-Id", resp.StatusCode, body)
	}
}

// TestForwardAuthExtraDimensionHeader: a dimension header the gateway forgot to strip (a
// region the client wrote) takes no request out of its tenant's limit.
func TestForwardAuthExtraDimensionHeader(t *testing.T) {
	t.Parallel()
	callers := callersOf(t, "anonymous: {permissions: [check]}\n")
	env := newEnvWith(t, checker.Config{Rules: mustRules(t, `
rules:
  - {id: per-tenant, dimension: tenant, endpoint: "/t/*", algorithm: fixed_window, limit: 2, window: 1h}
`)}, Config{Callers: callers, ForwardAuth: ForwardAuthConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		DimensionHeaders: []DimensionHeader{{Dimension: "tenant", Header: "X-Tenant-Id"},
			{Dimension: "region", Header: "X-Region"}},
	}})
	tenant := id(t, "acme")
	for i, region := range []string{"", "eu", "made-up-" + tenant} {
		h := map[string]string{"X-Tenant-Id": tenant, "X-Forwarded-Uri": "/t/x"}
		if region != "" {
			h["X-Region"] = region
		}
		resp, _ := getForwardAuth(t, env, h, "")
		want := http.StatusOK
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Errorf("request %d (region %q): %d, want %d: the tenant's limit of 2 counts every request", i+1, region, resp.StatusCode, want)
		}
	}
}

// callersOf is a callers registry loaded from a callers file's text.
func callersOf(t *testing.T, text string) *auth.Registry {
	t.Helper()
	callers := new(auth.Registry)
	if err := callers.Load([]byte(text)); err != nil {
		t.Fatal(err)
	}
	return callers
}
