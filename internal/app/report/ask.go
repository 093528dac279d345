package report

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// Check is one question to a checker as quotaflow check asks it: of which subjects, on which
// endpoint, in which call (a reservation with Estimate, a quota query with Peek, else a
// check). Its answer is rendered by Decision, so the two are kept together.
type Check struct {
	User, IP, APIKey string
	// Custom are custom dimensions' values, each name=value (tenant=acme), in order.
	Custom                         []string
	Endpoint, Tier, IdempotencyKey string
	Cost, Estimate                 int64
	Peek                           bool
	ReserveTTL                     time.Duration
}

// Subjects are the subjects c names: user, IP, API key, then the custom ones in order.
func (c *Check) Subjects() []*quotaflowv1.Subject {
	var subjects []*quotaflowv1.Subject
	for _, s := range []struct {
		dim quotaflowv1.Dimension
		id  string
	}{{quotaflowv1.Dimension_DIMENSION_USER, c.User}, {quotaflowv1.Dimension_DIMENSION_IP, c.IP}, {quotaflowv1.Dimension_DIMENSION_API_KEY, c.APIKey}} {
		if s.id != "" {
			subjects = append(subjects, &quotaflowv1.Subject{Dimension: s.dim, Identifier: s.id})
		}
	}
	for _, cd := range c.Custom {
		name, value, _ := strings.Cut(cd, "=")
		subjects = append(subjects, &quotaflowv1.Subject{CustomDimension: name, Identifier: value})
	}
	return subjects
}

// Ask makes the call c chooses (Reserve, GetRemainingQuota or CheckRateLimit) and returns its
// response and decision.
func (c *Check) Ask(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient) (proto.Message, Decision, error) {
	subjects := c.Subjects()
	switch {
	case c.Estimate != 0:
		resp, err := rpc.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{
			Check: &quotaflowv1.CheckRateLimitRequest{Subjects: subjects, Endpoint: c.Endpoint, Tier: c.Tier,
				Timestamp: time.Now().UnixMilli()},
			Estimate: c.Estimate, TtlMs: c.ReserveTTL.Milliseconds()}))
		if err != nil {
			return nil, Decision{}, fmt.Errorf("Reserve: %w", err)
		}
		return resp.Msg, reserveDecision(resp.Msg), nil
	case c.Peek:
		resp, err := rpc.GetRemainingQuota(ctx, connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
			Subjects: subjects, Endpoint: c.Endpoint, Cost: c.Cost, Tier: c.Tier}))
		if err != nil {
			return nil, Decision{}, fmt.Errorf("GetRemainingQuota: %w", err)
		}
		return resp.Msg, QuotaDecision(resp.Msg), nil
	}
	resp, err := rpc.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Subjects: subjects, Endpoint: c.Endpoint, Cost: c.Cost, Tier: c.Tier, IdempotencyKey: c.IdempotencyKey,
		Timestamp: time.Now().UnixMilli()}))
	if err != nil {
		return nil, Decision{}, fmt.Errorf("CheckRateLimit: %w", err)
	}
	return resp.Msg, CheckDecision(resp.Msg), nil
}

// Settle settles reservation id at actual units, or with cancel refunds its whole estimate,
// and returns the line that says so (Settled, Cancelled).
func Settle(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient, id string, actual int64, cancel bool) (string, error) {
	if cancel {
		resp, err := rpc.Cancel(ctx, connect.NewRequest(&quotaflowv1.CancelRequest{ReservationId: id}))
		if err != nil {
			return "", fmt.Errorf("Cancel: %w", err)
		}
		return cancelled(resp.Msg), nil
	}
	resp, err := rpc.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: id, Actual: actual}))
	if err != nil {
		return "", fmt.Errorf("Settle: %w", err)
	}
	return settled(resp.Msg), nil
}

// Release releases concurrency lease id, or with renew holds its places for their rules'
// windows from now, and returns the line that says so.
func Release(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient, id string, renew bool) (string, error) {
	if renew {
		resp, err := rpc.RenewLease(ctx, connect.NewRequest(&quotaflowv1.RenewLeaseRequest{LeaseId: id}))
		if err != nil {
			return "", fmt.Errorf("RenewLease: %w", err)
		}
		return renewed(resp.Msg), nil
	}
	if _, err := rpc.ReleaseLease(ctx, connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: id})); err != nil {
		return "", fmt.Errorf("ReleaseLease: %w", err)
	}
	return "released", nil
}
