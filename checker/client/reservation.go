package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Reservation is what an allowed Reserve holds: Estimate charged to every limit of the check
// until Settle or Cancel, or until ExpiresAt, after which the estimate stands.
type Reservation struct {
	ID        string
	ExpiresAt time.Time
	Estimate  int64
}

// Settlement is what a Settle did.
type Settlement struct {
	Estimate, Actual int64
	// Overage is set when Actual exceeded Estimate by more than a limit had left: it was
	// charged all the same.
	Overage bool
	// Remaining is the least any of the reservation's limits has left.
	Remaining int64
}

// Reserve asks whether req may go ahead at an estimated cost (req.Cost must be 0), charging the
// estimate until Settle or Cancel, or for ttl (0: the checker's default, 5 minutes). A denial is
// a Decision with Allowed false and no Reservation. It is sent once, never retried: a
// reservation has no idempotency key, and a retry could hold the estimate twice. When the
// checker cannot be reached the fail mode decides, with no Reservation (nothing was charged).
func (c *Client) Reserve(ctx context.Context, req Request, estimate int64, ttl time.Duration) (Decision, *Reservation, error) {
	if req.Cost != 0 || req.IdempotencyKey != "" {
		return Decision{}, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("quotaflow reserve: leave Cost and IdempotencyKey unset: the estimate is the cost"))
	}
	msg := req.proto()
	msg.IdempotencyKey = ""
	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.rpc.Reserve(actx, connect.NewRequest(&quotaflowv1.ReserveRequest{Check: msg, Estimate: estimate, TtlMs: ttl.Milliseconds()}))
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, nil, fmt.Errorf("quotaflow reserve: %w", ctx.Err())
		}
		if transient(err) {
			return c.failMode(subjectKey(req), err), nil, nil
		}
		return Decision{}, nil, fmt.Errorf("quotaflow reserve: %w", err)
	}
	d := decision(resp.Msg.GetResult())
	if resp.Msg.ReservationId == "" {
		return d, nil, nil
	}
	return d, &Reservation{ID: resp.Msg.ReservationId, ExpiresAt: time.UnixMilli(resp.Msg.ExpiresAtMs), Estimate: estimate}, nil
}

// Settle charges (or refunds) the difference between actual and the reservation's estimate.
// It is retried while it fails transiently: a settle happens at most once per reservation, so
// a retry whose first attempt did settle is told FailedPrecondition, which Settle then takes
// for its own success (with an empty Settlement). The errors are the checker's: NotFound for an
// unknown or expired reservation (its estimate stands), FailedPrecondition for one settled
// before.
func (c *Client) Settle(ctx context.Context, id string, actual int64) (Settlement, error) {
	var resp *connect.Response[quotaflowv1.SettleResponse]
	attempts := 0
	err := c.retry(ctx, func(ctx context.Context) error {
		attempts++
		var err error
		resp, err = c.rpc.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: id, Actual: actual}))
		return err
	})
	switch {
	case err != nil && attempts > 1 && connect.CodeOf(err) == connect.CodeFailedPrecondition:
		return Settlement{Actual: actual}, nil
	case err != nil:
		return Settlement{}, fmt.Errorf("quotaflow settle: %w", err)
	}
	m := resp.Msg
	return Settlement{Estimate: m.Estimate, Actual: m.Actual, Overage: m.Overage, Remaining: m.Remaining}, nil
}

// Cancel refunds a reservation's whole estimate; errors as Settle's.
func (c *Client) Cancel(ctx context.Context, id string) error {
	attempts := 0
	err := c.retry(ctx, func(ctx context.Context) error {
		attempts++
		_, err := c.rpc.Cancel(ctx, connect.NewRequest(&quotaflowv1.CancelRequest{ReservationId: id}))
		return err
	})
	if err != nil && !(attempts > 1 && connect.CodeOf(err) == connect.CodeFailedPrecondition) {
		return fmt.Errorf("quotaflow cancel: %w", err)
	}
	return nil
}

// Reserved reserves estimate for req and, when allowed, runs fn and settles the reservation at
// the cost fn reports, even when fn fails (the work it did is charged; report 0 to refund it
// all). A denial returns the Decision without running fn. The settle runs after ctx ends too,
// bounded by the Client's timeout: the charge must not stay at the estimate because the caller
// gave up. The error joins fn's and the settle's.
func (c *Client) Reserved(ctx context.Context, req Request, estimate int64, fn func(ctx context.Context) (actual int64, err error)) (Decision, error) {
	d, r, err := c.Reserve(ctx, req, estimate, 0)
	if err != nil || !d.Allowed {
		return d, err
	}
	actual, ferr := fn(ctx)
	if r == nil {
		return d, ferr // a fail mode's admission: nothing to settle
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout*time.Duration(c.cfg.Retries+1))
	defer cancel()
	_, serr := c.Settle(sctx, r.ID, max(actual, 0))
	return d, errors.Join(ferr, serr)
}
