package transport

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"connectrpc.com/connect"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Tokens of the trust tests' callers.
const (
	gatewayToken = "edge-gateway-token-0001"
	serviceToken = "orders-service-token-01"
	opsToken     = "ops-reset-token-000001"
	adminToken   = "admin-write-token-00001"
)

// trustRules: bob is a free user (10 per hour), premium users get 1000; API key k-premium is
// on the premium tier.
const trustRules = `
default_tier: free
tiers: {free: {}, premium: {}}
users:
  vip: {tier: premium}
api_keys:
  k-premium: {tier: premium}
rules:
  - {id: free-api, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 10, window: 1h}
  - {id: premium-api, dimension: user, endpoint: /api/*, tier: premium, algorithm: fixed_window, limit: 1000, window: 1h}
  - {id: key-api, dimension: apikey, endpoint: /api/*, algorithm: fixed_window, limit: 5, window: 1h}
  - {id: key-api-premium, dimension: apikey, endpoint: /api/*, tier: premium, algorithm: fixed_window, limit: 500, window: 1h}
  - {id: search, dimension: user, endpoint: /search, algorithm: fixed_window, limit: 5, window: 10s}
  - {id: ip-any, dimension: ip, endpoint: /ip, algorithm: fixed_window, limit: 1, window: 1h}
`

// newTrustEnv serves the trust rules with tcfg; withCallers adds a callers file: a gateway
// that may assert tiers, a service that may only check, an operator that may reset; and the
// admin API's write token.
func newTrustEnv(t *testing.T, withCallers bool, tcfg Config) *testEnv {
	t.Helper()
	reg := new(auth.Registry)
	if withCallers {
		if err := reg.Load([]byte(`
anonymous: {permissions: [check]}
callers:
  - {name: edge, token: ` + gatewayToken + `, permissions: [check, assert-tier]}
  - {name: orders, token: ` + serviceToken + `, permissions: [check]}
  - {name: ops, token: ` + opsToken + `, permissions: [reset]}
`)); err != nil {
			t.Fatal(err)
		}
	}
	reg.SetAdminTokens(map[string]string{adminToken: "alice-ops"})
	tcfg.Callers = reg
	return newEnvWith(t, checker.Config{Rules: mustRules(t, trustRules)}, tcfg)
}

func withToken[T any](req *connect.Request[T], token string) *connect.Request[T] {
	if token != "" {
		req.Header().Set("Authorization", "Bearer "+token)
	}
	return req
}

// TestTierSpoofing: a request that names a tier is refused unless its caller may assert tiers;
// then it is honoured. Without it, the tier is the subject's own.
func TestTierSpoofing(t *testing.T) {
	t.Parallel()
	open := newTrustEnv(t, false, Config{})
	env := newTrustEnv(t, true, Config{})
	bob := id(t, "bob")
	spoof := func() *connect.Request[quotaflowv1.CheckRateLimitRequest] {
		return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Identifier: bob, Dimension: quotaflowv1.Dimension_DIMENSION_USER,
			Endpoint: "/api/x", Tier: "premium"})
	}
	tests := []struct {
		name, token string
		env         *testEnv
		wantCode    connect.Code // 0: allowed under the premium tier
	}{
		{"anonymous, no callers configured", "", open, connect.CodePermissionDenied},
		{"anonymous, callers configured", "", env, connect.CodePermissionDenied},
		{"a service that may only check", serviceToken, env, connect.CodePermissionDenied},
		{"an unknown token", "not-a-token-of-anyone", env, connect.CodeUnauthenticated},
		{"the gateway", gatewayToken, env, 0},
		{"an admin token", adminToken, open, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tt.env.client("connect").CheckRateLimit(context.Background(), withToken(spoof(), tt.token))
			if tt.wantCode != 0 {
				if connect.CodeOf(err) != tt.wantCode || (tt.wantCode == connect.CodePermissionDenied && !strings.Contains(err.Error(), "tier")) {
					t.Fatalf("CheckRateLimit naming a tier = %v, %v; want %v naming the field tier", resp, err, tt.wantCode)
				}
				return
			}
			if err != nil || resp.Msg.Tier != "premium" || resp.Msg.RuleId != "premium-api" {
				t.Fatalf("CheckRateLimit from a caller that may assert tiers = %v, %v; want the premium tier", resp, err)
			}
		})
	}
	// Without a tier, bob's own (free) tier applies, whoever asks.
	got := mustCheck(t, open.client("connect"), checkReq(bob, "/api/x"))
	if got.Tier != "free" || got.RuleId != "free-api" {
		t.Errorf("bob without a tier: tier %q rule %q, want free and free-api", got.Tier, got.RuleId)
	}

	// Forward-auth: X-RateLimit-Tier (and ?tier=) need assert-tier: 403 naming the header.
	resp, body := getForwardAuth(t, open, map[string]string{"X-User-Id": bob, "X-Forwarded-Uri": "/api/x", "X-RateLimit-Tier": "premium"}, "")
	if resp.StatusCode != http.StatusForbidden || body["error"] != "permission_denied" || !strings.Contains(body["message"].(string), "X-RateLimit-Tier") {
		t.Errorf("forward-auth naming a tier = %d %v, want 403 permission_denied naming X-RateLimit-Tier", resp.StatusCode, body)
	}
	resp, body = getForwardAuth(t, env, map[string]string{"Authorization": "Bearer " + gatewayToken, "X-User-Id": bob,
		"X-Forwarded-Uri": "/api/x", "X-RateLimit-Tier": "premium"}, "")
	if resp.StatusCode != http.StatusOK || body["tier"] != "premium" {
		t.Errorf("forward-auth naming a tier from the gateway = %d %v, want 200 under premium", resp.StatusCode, body)
	}

	// Envoy RLS: a tier entry needs assert-tier too, over Connect (in process) and grpc-go.
	req := &ratelimitv3.RateLimitRequest{Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{
		{Key: "user_id", Value: bob}, {Key: "path", Value: "/api/x"}, {Key: "tier", Value: "premium"}}}}}
	if _, err := open.srv.ShouldRateLimit(context.Background(), connect.NewRequest(req)); connect.CodeOf(err) != connect.CodePermissionDenied ||
		!strings.Contains(err.Error(), "descriptors[0].entries[2].value") {
		t.Errorf("RLS with a tier entry = %v, want PermissionDenied naming descriptors[0].entries[2].value", err)
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(env.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := ratelimitv3.NewRateLimitServiceClient(conn)
	if _, err := rls.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.PermissionDenied {
		t.Errorf("grpc-go RLS with a tier entry, no token = %v, want PermissionDenied", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+gatewayToken)
	if r, err := rls.ShouldRateLimit(ctx, req); err != nil || r.OverallCode != ratelimitv3.RateLimitResponse_OK {
		t.Errorf("grpc-go RLS with a tier entry from the gateway = %v, %v; want OK", r, err)
	}
}

// TestAPIKeyTier: an API key's tier comes from the configuration; a user's own tier wins.
func TestAPIKeyTier(t *testing.T) {
	t.Parallel()
	env := newTrustEnv(t, false, Config{})
	check := func(subjects ...*quotaflowv1.Subject) *quotaflowv1.CheckRateLimitResponse {
		return mustCheck(t, env.client("connect"), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Subjects: subjects, Endpoint: "/api/x"}))
	}
	key := func(k string) *quotaflowv1.Subject {
		return &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_API_KEY, Identifier: k}
	}
	user := func(u string) *quotaflowv1.Subject {
		return &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: u}
	}
	for _, tt := range []struct {
		name     string
		subjects []*quotaflowv1.Subject
		want     string
	}{
		{"a premium key", []*quotaflowv1.Subject{key("k-premium")}, "premium"},
		{"an unknown key", []*quotaflowv1.Subject{key(id(t, "k"))}, "free"},
		{"an unconfigured user with a premium key", []*quotaflowv1.Subject{user(id(t, "u")), key("k-premium")}, "premium"},
		{"a configured user's tier wins", []*quotaflowv1.Subject{user("vip"), key(id(t, "k2"))}, "premium"},
	} {
		if got := check(tt.subjects...); got.Tier != tt.want {
			t.Errorf("%s: tier %q, want %q", tt.name, got.Tier, tt.want)
		}
	}
}

// TestResetNeedsPermission: ResetLimit is refused to callers without credentials, whatever the
// configuration, and allowed to the admin API's write token and to callers with reset.
func TestResetNeedsPermission(t *testing.T) {
	t.Parallel()
	open := newTrustEnv(t, false, Config{})
	env := newTrustEnv(t, true, Config{})
	reset := func() *connect.Request[quotaflowv1.ResetLimitRequest] {
		return connect.NewRequest(&quotaflowv1.ResetLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER})
	}
	for _, tt := range []struct {
		name, token string
		env         *testEnv
		want        connect.Code
	}{
		{"anonymous, no callers configured", "", open, connect.CodePermissionDenied},
		{"anonymous, callers configured", "", env, connect.CodePermissionDenied},
		{"a service that may only check", serviceToken, env, connect.CodePermissionDenied},
		{"a wrong token", "not-a-token-of-anyone", open, connect.CodeUnauthenticated},
		{"the admin write token, no callers configured", adminToken, open, 0},
		{"a caller with reset", opsToken, env, 0},
	} {
		_, err := tt.env.client("grpcweb").ResetLimit(context.Background(), withToken(reset(), tt.token))
		if connect.CodeOf(err) != tt.want && !(tt.want == 0 && err == nil) {
			t.Errorf("%s: ResetLimit = %v, want code %v", tt.name, err, tt.want)
		}
	}
	// And over grpc-go, with the token in the metadata.
	conn, err := grpc.NewClient(strings.TrimPrefix(open.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := quotaflowv1.NewRateLimiterClient(conn)
	if _, err := c.ResetLimit(context.Background(), reset().Msg); status.Code(err) != codes.PermissionDenied {
		t.Errorf("grpc-go ResetLimit without a token = %v, want PermissionDenied", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+adminToken)
	if _, err := c.ResetLimit(ctx, reset().Msg); err != nil {
		t.Errorf("grpc-go ResetLimit with the admin token = %v, want nil", err)
	}
}

// TestAnonymousChecks: without a callers file anyone may check; with one, callers without
// credentials get what its anonymous: entry allows.
func TestAnonymousChecks(t *testing.T) {
	t.Parallel()
	reg := new(auth.Registry)
	if err := reg.Load([]byte("callers: [{name: orders, token: " + serviceToken + ", permissions: [check]}]\n")); err != nil {
		t.Fatal(err)
	}
	closed := newEnvWith(t, checker.Config{Rules: mustRules(t, trustRules)}, Config{Callers: reg})
	if _, err := closed.client("connect").CheckRateLimit(context.Background(), checkReq(id(t, "u"), "/api/x")); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("anonymous check with callers and no anonymous: entry = %v, want PermissionDenied", err)
	}
	if _, err := closed.client("grpc").CheckRateLimit(context.Background(), withToken(checkReq(id(t, "u"), "/api/x"), serviceToken)); err != nil {
		t.Errorf("check with a service token = %v, want allowed", err)
	}
	open := newTrustEnv(t, false, Config{})
	mustCheck(t, open.client("grpc"), checkReq(id(t, "u"), "/api/x"))
}

// TestForwardAuthClientIP: forwarded addresses are believed only from trusted proxies,
// walking X-Forwarded-For from the right past them.
func TestForwardAuthClientIP(t *testing.T) {
	t.Parallel()
	untrusted := newTrustEnv(t, false, Config{})
	trusted := newTrustEnv(t, false, Config{ForwardAuth: ForwardAuthConfig{TrustedProxies: []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}}})
	for _, tt := range []struct {
		name    string
		env     *testEnv
		headers map[string]string
		want    string // the IP subject's bucket that the check charges
	}{
		{"untrusted peer: headers ignored", untrusted, map[string]string{"X-Forwarded-For": "203.0.113.9", "X-Real-Ip": "203.0.113.8"}, "127.0.0.1"},
		{"trusted peer: rightmost untrusted hop", trusted, map[string]string{"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 10.1.2.3"}, "203.0.113.9"},
		{"trusted peer: X-Real-Ip", trusted, map[string]string{"X-Real-Ip": "203.0.113.7"}, "203.0.113.7"},
		{"trusted peer: garbage stops the walk", trusted, map[string]string{"X-Forwarded-For": "203.0.113.5, not-an-ip, 10.1.2.3"}, "10.1.2.3"},
		{"trusted peer, no header: the peer", trusted, map[string]string{}, "127.0.0.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.headers
			h["X-Forwarded-Uri"] = "/ip"
			h["X-User-Id"] = id(t, "u")
			resp, body := getForwardAuth(t, tt.env, h, "")
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("forward-auth = %d %v", resp.StatusCode, body)
			}
			// The IP subject is the one the ip-any bucket (limit 1) was charged for.
			q, err := tt.env.client("connect").GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
				Identifier: tt.want, Dimension: quotaflowv1.Dimension_DIMENSION_IP, Endpoint: "/ip"}))
			if err != nil || q.Msg.Remaining != 0 {
				t.Errorf("ip-any of %s: %v, %v; want it charged (remaining 0)", tt.want, q, err)
			}
		})
	}
}

// TestForwardAuthHeaders: the user, API key and endpoint headers are configurable.
func TestForwardAuthHeaders(t *testing.T) {
	t.Parallel()
	env := newTrustEnv(t, false, Config{ForwardAuth: ForwardAuthConfig{UserHeader: "X-Auth-Subject", APIKeyHeader: "X-Key", EndpointHeader: "X-Path"}})
	resp, body := getForwardAuth(t, env, map[string]string{"X-Auth-Subject": "vip", "X-Key": id(t, "k"), "X-Path": "/api/x"}, "")
	if resp.StatusCode != http.StatusOK || body["tier"] != "premium" || body["rule_id"] == nil {
		t.Errorf("configured headers = %d %v, want vip's premium tier", resp.StatusCode, body)
	}
	// The default endpoint headers are no longer read.
	resp, body = getForwardAuth(t, env, map[string]string{"X-Auth-Subject": "vip", "X-Forwarded-Uri": "/api/x"}, "")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body["message"].(string), "X-Path: required") {
		t.Errorf("without the configured endpoint header = %d %v, want 400 naming X-Path", resp.StatusCode, body)
	}
}

// TestForwardAuthIdempotencyOff: by default forward-auth reads no idempotency key, so a client
// that repeats one is charged every time (the reported abuse: 9 of 9 allowed where the rule
// allows 5 per 10 s); a gateway's header is read only when named.
func TestForwardAuthIdempotencyOff(t *testing.T) {
	t.Parallel()
	env := newTrustEnv(t, false, Config{})
	h := map[string]string{"X-User-Id": id(t, "u"), "X-Forwarded-Uri": "/search", "X-Idempotency-Key": "same-key-every-time"}
	allowed := 0
	for range 9 {
		if resp, _ := getForwardAuth(t, env, h, ""); resp.StatusCode == http.StatusOK {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("%d of 9 allowed with a repeated key, want 5 (the rule's limit)", allowed)
	}
	named := newTrustEnv(t, false, Config{ForwardAuth: ForwardAuthConfig{IdempotencyHeader: "X-Gateway-Request-Id"}})
	h = map[string]string{"X-User-Id": id(t, "u2"), "X-Forwarded-Uri": "/search", "X-Gateway-Request-Id": "req-1"}
	for i := range 3 {
		resp, body := getForwardAuth(t, named, h, "")
		if resp.StatusCode != http.StatusOK || body["remaining"] != float64(4) {
			t.Errorf("retry %d with the gateway's request id = %d %v, want the first decision (remaining 4)", i, resp.StatusCode, body)
		}
	}
}
