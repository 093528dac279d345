package client

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// ReleaseLease frees the places in flight of an allowed check (Decision.LeaseID), so that other
// requests may take them at once. The checker answers NotFound for an id that holds nothing (a
// second release is that, never a second free) and FailedPrecondition for one whose places
// freed themselves at their expiry; the error is the checker's, a *connect.Error.
func (c *Client) ReleaseLease(ctx context.Context, id string) error {
	err := c.retry(ctx, func(ctx context.Context) error {
		_, err := c.rpc.ReleaseLease(ctx, connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: id}))
		return err
	})
	if err != nil {
		return fmt.Errorf("quotaflow release: %w", err)
	}
	return nil
}

// RenewLease holds a check's places for their rules' windows from now, for a request that runs
// longer than that, and returns the new expiry; errors as ReleaseLease's.
func (c *Client) RenewLease(ctx context.Context, id string) (time.Time, error) {
	var resp *connect.Response[quotaflowv1.RenewLeaseResponse]
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.rpc.RenewLease(ctx, connect.NewRequest(&quotaflowv1.RenewLeaseRequest{LeaseId: id}))
		return err
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("quotaflow renew: %w", err)
	}
	return time.UnixMilli(resp.Msg.ExpiresAtMs), nil
}

// releaseAfter releases d's lease, if it has one, once the request it admitted is done: with a
// context of its own (the request's may be over), bounded by the client's timeout. A failed
// release is logged: the places then free themselves at their expiry.
func (c *Client) releaseAfter(d *Decision) {
	if d == nil || d.LeaseID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	if err := c.ReleaseLease(ctx, d.LeaseID); err != nil {
		c.log.Warn("lease not released: its places free themselves at their expiry", "expires_at", d.LeaseExpiresAt, "err", err)
	}
}
