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

// Usage is usage measured outside a check that burns a balance (RecordUsage).
type Usage struct {
	Entitlement string
	// Subject is the holder: a user's, API key's or org's id, or a custom dimension's value.
	Subject string
	// Amount is what was used, 1 or more.
	Amount int64
	// EventID identifies the usage, as a CloudEvent's id; empty: the Client draws one, so that
	// its own retries burn once. A caller that may send the usage again (after a crash) names
	// it itself.
	EventID string
	// Endpoint is what the usage was of, for the audit; empty: "/".
	Endpoint string
}

// RecordUsage burns u from its subject's balance, once per event id: the live grants, then
// overage past a hard balance too (the response's excess), since the usage happened. It is
// retried like a check: the event id makes a retry burn nothing. An unknown entitlement is the
// checker's NotFound, a bad field its InvalidArgument, both *connect.Error.
func (c *Client) RecordUsage(ctx context.Context, u Usage) (*quotaflowv1.RecordUsageResponse, error) {
	if u.EventID == "" {
		u.EventID = newKey()
	}
	req := &quotaflowv1.RecordUsageRequest{Entitlement: u.Entitlement, Subject: u.Subject, Amount: u.Amount, EventId: u.EventID, Endpoint: u.Endpoint}
	var resp *connect.Response[quotaflowv1.RecordUsageResponse]
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.rpc.RecordUsage(ctx, connect.NewRequest(req))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("quotaflow record usage: %w", err)
	}
	return resp.Msg, nil
}
