package transport

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestOrgDenialOverRPC: a member's check denied by its org's shared budget says so: the
// deciding rule is the org's, and its status names DIMENSION_ORG and the org; an admin resets
// the org's budget by naming it.
func TestOrgDenialOverRPC(t *testing.T) {
	t.Parallel()
	org, user := id(t, "acme"), id(t, "member")
	e := newEnv(t, checker.Config{Rules: mustRules(t, `
default_tier: free
tiers: {free: {}}
users:
  `+user+`: {org: `+org+`}
rules:
  - {id: org-day, dimension: org, endpoint: /llm, algorithm: fixed_window, limit: 2, window: 24h}
  - {id: member-day, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 10, window: 24h}
`)})
	for _, protocol := range []string{"connect", "grpc"} {
		c := e.client(protocol)
		var first, last *quotaflowv1.CheckRateLimitResponse
		for range 3 {
			resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/llm"}))
			if err != nil {
				t.Fatal(err)
			}
			last = resp.Msg
			if first == nil {
				first = last
			}
		}
		if !first.Allowed {
			t.Fatalf("%s: first check denied, want allowed (the org's budget reset)", protocol)
		}
		var orgStatus *quotaflowv1.LimitStatus
		for _, l := range last.Limits {
			if l.RuleId == "org-day" {
				orgStatus = l
			}
		}
		if last.Allowed || last.RuleId != "org-day" || orgStatus == nil || orgStatus.Dimension != quotaflowv1.Dimension_DIMENSION_ORG || orgStatus.Identifier != org {
			t.Fatalf("%s: 3rd check %v; want denied by org-day, its status naming DIMENSION_ORG %s", protocol, last, org)
		}
		if _, err := c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
			Dimension: quotaflowv1.Dimension_DIMENSION_ORG, Identifier: org, Endpoint: "/llm"})); err != nil {
			t.Fatalf("%s: reset of the org: %v", protocol, err)
		}
	}
}

// TestOrgOncePerRLSRequest: Envoy's descriptors of one request that name the same user are
// one request to the user's org: it counts once, as the global rules do.
func TestOrgOncePerRLSRequest(t *testing.T) {
	t.Parallel()
	org, user := id(t, "acme"), id(t, "member")
	e := newRLSEnv(t, checker.Config{Rules: mustRules(t, `
default_tier: free
tiers: {free: {}}
users:
  `+user+`: {org: `+org+`}
rules:
  - {id: org-day, dimension: org, endpoint: /llm, algorithm: fixed_window, limit: 2, window: 24h}
`)})
	req := rlsReq(desc("user_id", user, "path", "/llm"), desc("user_id", user, "path", "/llm"))
	for i, want := range []ratelimitv3.RateLimitResponse_Code{rlsOK, rlsOK, rlsOver} {
		if got := e.should(t, req).OverallCode; got != want {
			t.Errorf("request %d of two descriptors each: %s, want %s (the org counted once per request)", i+1, got, want)
		}
	}
}
