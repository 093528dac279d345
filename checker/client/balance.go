package client

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Balance answers subject's balance of entitlement (GetBalance): what the live grants have
// left, the period's usage and overage, and each grant. A read charges nothing, so it is
// retried like a check. An unknown entitlement is the checker's NotFound, a *connect.Error.
func (c *Client) Balance(ctx context.Context, entitlement, subject string) (*quotaflowv1.GetBalanceResponse, error) {
	var resp *connect.Response[quotaflowv1.GetBalanceResponse]
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.rpc.GetBalance(ctx, connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: entitlement, Subject: subject}))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("quotaflow balance: %w", err)
	}
	return resp.Msg, nil
}
