package client_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker/client"
)

// TestReserved: the helper reserves, runs the function and settles at what it reports; a
// denial does not run it; a settle whose answer is lost is retried and counted once.
func TestReserved(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	ctx := context.Background()
	req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user(t, "u")}}, Endpoint: "/big"}

	d, err := c.Reserved(ctx, req, 100, func(context.Context) (int64, error) { return 30, nil })
	if err != nil || !d.Allowed {
		t.Fatalf("Reserved: %+v, %v; want allowed", d, err)
	}
	left := func() int64 {
		t.Helper()
		d, err := c.Check(ctx, client.Request{Subjects: req.Subjects, Endpoint: "/big"})
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining + 1 // the check's own unit
	}
	if got := left(); got != 970 {
		t.Fatalf("after a reservation of 100 settled at 30: %d left, want 970", got)
	}

	// The settle's answer is lost once: the retry is told it was settled, and nothing is
	// charged twice.
	d, r, err := c.Reserve(ctx, req, 50, 0)
	if err != nil || r == nil || r.Estimate != 50 {
		t.Fatalf("Reserve: %+v, %+v, %v", d, r, err)
	}
	chk.failNext.Store(true)
	if _, err := c.Settle(ctx, r.ID, 70); err != nil {
		t.Fatalf("Settle with a lost answer: %v, want its retry to succeed", err)
	}
	if got := left(); got != 969-70 {
		t.Errorf("after a settle at 70 whose answer was lost: %d left, want %d", got, 969-70)
	}
	if _, err := c.Settle(ctx, r.ID, 70); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("a second Settle: %v, want FailedPrecondition", err)
	}

	small := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user(t, "s")}}, Endpoint: "/orders"}
	if d, _, err := c.Reserve(ctx, small, 3, 0); err != nil || !d.Allowed {
		t.Fatalf("Reserve 3 of 3: %+v, %v", d, err)
	}
	ran := false
	d, err = c.Reserved(ctx, small, 1, func(context.Context) (int64, error) { ran = true; return 1, nil })
	if err != nil || d.Allowed || ran {
		t.Errorf("Reserved past the limit: %+v, %v, ran %v; want denied, not run", d, err, ran)
	}

	// fn's failure is returned, and what it reports is settled all the same.
	boom := errors.New("boom")
	other := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user(t, "o")}}, Endpoint: "/orders"}
	if _, err := c.Reserved(ctx, other, 3, func(context.Context) (int64, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Errorf("Reserved with a failing function: %v, want its error", err)
	}
	if d, _, _ := c.Reserve(ctx, other, 3, 0); !d.Allowed {
		t.Error("after a failed function that reported 0: a reserve of 3 of 3 denied, want the estimate refunded")
	}
	if _, _, err := c.Reserve(ctx, client.Request{Subjects: req.Subjects, Endpoint: "/big", Cost: 2}, 5, 0); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Reserve with a Cost: %v, want InvalidArgument", err)
	}
}
