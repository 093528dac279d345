package admin

import (
	"context"
	"fmt"
	"net/http"
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
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// outcome is how a call with a token ended: allowed through, refused as a wrong token, or
// refused as locked out.
type outcome string

const (
	passed      outcome = "passed"
	wrongToken  outcome = "unauthenticated"
	lockedOutOf outcome = "locked out"
)

// TestAuthLockoutAcrossAPIs is the reported bypass: the check API accepted admin tokens
// (ResetLimit) and counted no failure, so 30 wrong guesses got 30 answers. Failures now count
// against the source address alike on every protocol of the check API and on the admin API,
// in one budget: past it, every token from the address is refused, the right one included, on
// both APIs.
func TestAuthLockoutAcrossAPIs(t *testing.T) {
	t.Parallel()
	_, rdb := ownRedis(t) // the address's failure bucket is the test's own
	const limit = 10
	env, _ := newAdminEnvConfig(t, adminRules, checker.Config{Redis: rdb}, Config{AuthFailuresPerMinute: limit})
	conn, err := grpc.NewClient(strings.TrimPrefix(env.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	reset := &quotaflowv1.ResetLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER}
	connectCall := func(opts ...connect.ClientOption) func(string) outcome {
		c := quotaflowv1connect.NewRateLimiterClient(env.http, env.url, opts...)
		return func(token string) outcome {
			req := connect.NewRequest(reset)
			req.Header().Set("Authorization", "Bearer "+token)
			_, err := c.ResetLimit(ctx, req)
			return connectOutcome(t, err)
		}
	}
	grpcCtx := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	protocols := []struct {
		name string
		call func(token string) outcome
	}{
		{"connect ResetLimit", connectCall()},
		{"gRPC-Web ResetLimit", connectCall(connect.WithGRPCWeb())},
		{"gRPC ResetLimit", func(token string) outcome {
			_, err := quotaflowv1.NewRateLimiterClient(conn).ResetLimit(grpcCtx(token), reset)
			return grpcOutcome(t, err)
		}},
		{"RLS", func(token string) outcome {
			_, err := ratelimitv3.NewRateLimitServiceClient(conn).ShouldRateLimit(grpcCtx(token), &ratelimitv3.RateLimitRequest{
				Domain: "quotaflow", Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: id(t, "u")}}}}})
			return grpcOutcome(t, err)
		}},
		{"forward-auth", func(token string) outcome {
			req, _ := http.NewRequest(http.MethodGet, env.url+"/ratelimit/check", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("X-User-Id", id(t, "u"))
			req.Header.Set("X-Forwarded-Uri", "/api/x")
			resp, err := env.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusUnauthorized:
				return wrongToken
			case http.StatusTooManyRequests:
				if resp.Header.Get("Retry-After") == "" {
					t.Errorf("forward-auth 429 without Retry-After")
				}
				return lockedOutOf
			case http.StatusOK:
				return passed
			}
			t.Fatalf("forward-auth answered %d", resp.StatusCode)
			return ""
		}},
	}
	// Before any failure the right token passes everywhere.
	for _, p := range protocols {
		if got := p.call(writeToken); got != passed {
			t.Fatalf("%s with the right token = %s, want %s", p.name, got, passed)
		}
	}
	got := map[outcome]int{}
	for i := range 30 {
		p := protocols[i%len(protocols)]
		o := p.call(fmt.Sprintf("guess-%02d", i))
		got[o]++
		if want := map[bool]outcome{true: wrongToken, false: lockedOutOf}[i < limit]; o != want {
			t.Errorf("guess %d through %s = %s, want %s", i+1, p.name, o, want)
		}
	}
	if got[wrongToken] != limit || got[lockedOutOf] != 30-limit {
		t.Errorf("30 wrong guesses: %v, want %d unauthenticated and %d locked out", got, limit, 30-limit)
	}
	// The right token is refused too, on every protocol and on the admin API.
	for _, p := range protocols {
		if got := p.call(writeToken); got != lockedOutOf {
			t.Errorf("%s with the right token after the lockout = %s, want %s", p.name, got, lockedOutOf)
		}
	}
	if r := env.call(t, "GET", "/api/v1/rules", writeToken, nil); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Errorf("admin API with the right token after the lockout = %d %s, want 429 with Retry-After", r.status, r.raw)
	}
	// A call without credentials guesses nothing: it goes on as the anonymous caller's.
	if _, err := quotaflowv1connect.NewRateLimiterClient(env.http, env.url).CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/api/x"})); err != nil {
		t.Errorf("anonymous check from the locked-out address = %v, want it served", err)
	}
}

// TestAuthLockoutFromAdminAPI: failures at the admin API spend the check API's budget too.
func TestAuthLockoutFromAdminAPI(t *testing.T) {
	t.Parallel()
	_, rdb := ownRedis(t)
	env, _ := newAdminEnvConfig(t, adminRules, checker.Config{Redis: rdb}, Config{AuthFailuresPerMinute: 3})
	for i := range 3 {
		if r := env.call(t, "GET", "/api/v1/rules", fmt.Sprint("guess-", i), nil); r.status != http.StatusUnauthorized {
			t.Fatalf("admin guess %d = %d, want 401", i+1, r.status)
		}
	}
	req := connect.NewRequest(&quotaflowv1.ResetLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER})
	req.Header().Set("Authorization", "Bearer "+writeToken)
	_, err := quotaflowv1connect.NewRateLimiterClient(env.http, env.url).ResetLimit(context.Background(), req)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("check API with the right token after 3 admin failures = %v, want ResourceExhausted", err)
	}
}

func connectOutcome(t *testing.T, err error) outcome {
	t.Helper()
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return wrongToken
	case connect.CodeResourceExhausted:
		return lockedOutOf
	}
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	return passed
}

func grpcOutcome(t *testing.T, err error) outcome {
	t.Helper()
	switch status.Code(err) {
	case codes.Unauthenticated:
		return wrongToken
	case codes.ResourceExhausted:
		return lockedOutOf
	case codes.OK:
		return passed
	}
	t.Fatalf("unexpected error: %v", err)
	return ""
}
