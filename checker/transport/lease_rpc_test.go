package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestLeaseRPCs: over Connect and gRPC, an allowed check of a concurrency rule carries a lease
// id and its expiry; ReleaseLease frees its place for the next check, a second release is
// NotFound; RenewLease answers a later expiry; a malformed id is InvalidArgument naming
// lease_id.
func TestLeaseRPCs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, checker.Config{Rules: mustRules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: inflight, dimension: user, endpoint: /gen, algorithm: concurrency, limit: 1, window: 1m}
`)})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			c := e.client(protocol)
			ctx := context.Background()
			user := id(t, "u")
			check := func() *quotaflowv1.CheckRateLimitResponse {
				t.Helper()
				resp, err := c.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
					Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/gen"}))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Msg
			}
			first := check()
			if !first.Allowed || first.LeaseId == "" || time.Until(time.UnixMilli(first.LeaseExpiresAtMs)) < 50*time.Second {
				t.Fatalf("first check: allowed %v, lease %q expiring %d; want allowed with a lease of a minute", first.Allowed, first.LeaseId, first.LeaseExpiresAtMs)
			}
			if second := check(); second.Allowed || second.LeaseId != "" {
				t.Fatalf("second check while the first holds the place: allowed %v, lease %q; want denied, no lease", second.Allowed, second.LeaseId)
			}
			renewed, err := c.RenewLease(ctx, connect.NewRequest(&quotaflowv1.RenewLeaseRequest{LeaseId: first.LeaseId}))
			if err != nil || renewed.Msg.ExpiresAtMs < first.LeaseExpiresAtMs {
				t.Fatalf("RenewLease: %v, %v; want an expiry not before %d", renewed, err, first.LeaseExpiresAtMs)
			}
			if _, err := c.ReleaseLease(ctx, connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: first.LeaseId})); err != nil {
				t.Fatalf("ReleaseLease: %v", err)
			}
			_, err = c.ReleaseLease(ctx, connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: first.LeaseId}))
			if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound {
				t.Errorf("second ReleaseLease: %v, want NotFound", err)
			}
			if third := check(); !third.Allowed || third.LeaseId == "" {
				t.Errorf("after the release: allowed %v, lease %q; want allowed with a lease", third.Allowed, third.LeaseId)
			}
			_, err = c.ReleaseLease(ctx, connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: "forged"}))
			if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
				t.Errorf("ReleaseLease of a malformed id: %v, want InvalidArgument", err)
			}
		})
	}
}
