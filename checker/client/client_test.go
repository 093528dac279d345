package client_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

func orders(u string) client.Request {
	return client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: u}}, Endpoint: "/orders"}
}

// TestCheck: over each protocol, a limit of 3 allows 3 with the checker's counts, denies the 4th
// with a wait, and the deny cache answers the 5th without a call.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		protocol client.Protocol
		batch    time.Duration
	}{
		{"connect", client.Connect, -1},
		{"grpc", client.GRPC, -1},
		{"connect coalesced", client.Connect, 0},
		{"grpc coalesced", client.GRPC, 0},
		{"grpc-web", client.GRPCWeb, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chk := newChecker(t)
			c := client.New(chk.url(), client.Config{Protocol: tt.protocol, BatchWait: tt.batch, Timeout: testTimeout})
			defer c.Close()
			ctx := context.Background()
			u := user(t, "u")
			for i := 1; i <= 3; i++ {
				d, err := c.Check(ctx, orders(u))
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed || d.Remaining != int64(3-i) || d.Limit != 3 || d.RuleID != "user-orders" || d.Source != client.SourceChecker || d.Degraded {
					t.Fatalf("check %d = %+v, want allowed by the checker with %d of 3 left", i, d, 3-i)
				}
			}
			d, err := c.Check(ctx, orders(u))
			if err != nil || d.Allowed || d.RetryAfter <= 0 || d.Source != client.SourceChecker {
				t.Fatalf("4th check = %+v, %v; want denied by the checker with a wait", d, err)
			}
			calls := chk.calls.Load()
			d, err = c.Check(ctx, orders(u))
			if err != nil || d.Allowed || d.Source != client.SourceDenyCache || d.RetryAfter <= 0 || d.RuleID != "user-orders" {
				t.Fatalf("5th check = %+v, %v; want denied by the deny cache", d, err)
			}
			if got := chk.calls.Load(); got != calls {
				t.Errorf("the deny cache's answer made %d calls, want none", got-calls)
			}
			// The cache denies only what the checker denied: another user still asks.
			if d, err := c.Check(ctx, orders(user(t, "other"))); err != nil || !d.Allowed || d.Source != client.SourceChecker {
				t.Errorf("other user = %+v, %v; want allowed by the checker", d, err)
			}
		})
	}
}

// TestInvalid: a check the checker refuses is an error naming the field, not a fail-mode
// decision, alone and coalesced.
func TestInvalid(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	for _, wait := range []time.Duration{-1, 0} {
		c := client.New(chk.url(), client.Config{BatchWait: wait, Timeout: testTimeout})
		_, err := c.Check(context.Background(), client.Request{Subjects: []client.Subject{{Dimension: client.User}}, Endpoint: "/orders"})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "identifier") {
			t.Errorf("batch wait %v: empty identifier: %v, want InvalidArgument naming identifier", wait, err)
		}
	}
}

// TestCoalescing: checks that arrive while a batch is in flight travel together in one
// CheckRateLimits call, each with its own answer; the batch leaves when it is full or when the
// batch in flight comes back, whichever is first.
func TestCoalescing(t *testing.T) {
	t.Parallel()
	const n = 32
	for _, tt := range []struct {
		name     string
		batchMax int
	}{
		{"full", n - 1},
		{"when the batch in flight is back", 64},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chk := newChecker(t)
			// A wait far longer than the test: the batch never leaves because of it.
			c := client.New(chk.url(), client.Config{BatchWait: time.Minute, BatchMax: tt.batchMax, Timeout: testTimeout})
			defer c.Close()
			before := chk.calls.Load()
			u, ip := user(t, "u"), user(t, "ip")
			decisions := make([]client.Decision, n)
			errs := make([]error, n)
			check := func(i int) {
				req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: u}}, Endpoint: "/big"}
				if i == n-1 {
					req.Endpoint = "/api/x"
					req.Subjects = []client.Subject{{Dimension: client.IP, ID: ip}}
					req.Cost = 3 // over ip-api's limit of 2: invalid, alone
				}
				decisions[i], errs[i] = c.Check(context.Background(), req)
			}

			// The first check finds nothing in flight and leaves alone; the checker holds it.
			release := make(chan struct{})
			chk.hold.Store(&release)
			var wg sync.WaitGroup
			wg.Go(func() { check(0) })
			poll.Until(t, 10*time.Second, "the first check at the checker", poll.True(func() bool { return chk.calls.Load() == before+1 }))
			for i := 1; i < n; i++ {
				wg.Go(func() { check(i) })
			}
			// Release the first only once the others' way out is certain, or its return would
			// send those queued so far.
			if tt.batchMax < n {
				poll.Until(t, 10*time.Second, "the full batch at the checker", poll.True(func() bool { return chk.calls.Load() == before+2 }))
			} else {
				poll.Until(t, 10*time.Second, "the other checks queued", poll.True(func() bool { return c.PendingChecks() == n-1 }))
			}
			close(release)
			wg.Wait()

			if got := chk.calls.Load() - before; got != 2 {
				t.Errorf("%d checks, %d of them while one was in flight, made %d calls; want 2", n, n-1, got)
			}
			remaining := map[int64]bool{}
			for i := range n - 1 {
				if errs[i] != nil || !decisions[i].Allowed {
					t.Fatalf("check %d = %+v, %v; want allowed", i, decisions[i], errs[i])
				}
				remaining[decisions[i].Remaining] = true
			}
			// Each check was charged once: 1000-1 ... 1000-31 left, each seen once.
			if len(remaining) != n-1 || !remaining[1000-1] || !remaining[1000-(n-1)] {
				t.Errorf("remaining counts = %v, want each of %d..%d once", remaining, 1000-(n-1), 999)
			}
			if connect.CodeOf(errs[n-1]) != connect.CodeInvalidArgument {
				t.Errorf("the invalid check of the batch: %v, want its own InvalidArgument", errs[n-1])
			}
		})
	}
}

// TestCoalescingIdle: a check that finds no batch in flight leaves at once; with a BatchWait of
// a minute, waiting for company would run past the test's deadline.
func TestCoalescingIdle(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{BatchWait: time.Minute, Timeout: testTimeout})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := chk.calls.Load()
	u := user(t, "u")
	for i := range 3 {
		d, err := c.Check(ctx, client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: u}}, Endpoint: "/big"})
		if err != nil || !d.Allowed || d.Remaining != int64(1000-1-i) {
			t.Fatalf("check %d = %+v, %v; want allowed with %d left", i, d, err, 1000-1-i)
		}
	}
	if got := chk.calls.Load() - before; got != 3 {
		t.Errorf("3 checks one after another made %d calls, want 3", got)
	}
}

// TestRetryChargesOnce: a call the checker decided but whose answer was lost is retried with
// the same idempotency key, and the checker replays it instead of charging again.
func TestRetryChargesOnce(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{BatchWait: -1, Timeout: testTimeout})
	u := user(t, "u")
	chk.failNext.Store(true)
	d, err := c.Check(context.Background(), orders(u))
	if err != nil || !d.Allowed || !d.Replayed || d.Remaining != 2 || d.Source != client.SourceChecker {
		t.Fatalf("retried check = %+v, %v; want the first decision replayed: allowed, 2 left", d, err)
	}
	if d, err := c.Check(context.Background(), orders(u)); err != nil || d.Remaining != 1 {
		t.Errorf("next check = %+v, %v; want 1 left (the retry charged nothing)", d, err)
	}
}

// TestFailModes: with the checker stopped mid-test each fail mode decides, reported as
// degraded; once the checker is back the checker decides again.
func TestFailModes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode client.FailMode
		want []bool // the decisions of three checks while the checker is down
	}{
		{client.FailOpen, []bool{true, true, true}},
		{client.FailClosed, []bool{false, false, false}},
		{client.FailLocal, []bool{true, true, false}},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			t.Parallel()
			chk := newChecker(t)
			c := client.New(chk.url(), client.Config{FailMode: tt.mode, LocalBurst: 2, LocalRate: 0.001,
				Timeout: testTimeout, Retries: 1, ProbeInterval: 100 * time.Millisecond})
			defer c.Close()
			ctx := context.Background()
			u := user(t, "u")
			if d, err := c.Check(ctx, orders(u)); err != nil || !d.Allowed || d.Source != client.SourceChecker {
				t.Fatalf("before the outage: %+v, %v; want allowed by the checker", d, err)
			}
			chk.stop()
			for i, want := range tt.want {
				d, err := c.Check(ctx, orders(u))
				if err != nil || d.Allowed != want || !d.Degraded || d.Source != client.SourceFailMode || d.Err == nil {
					t.Errorf("check %d while down = %+v, %v; want allowed %v by the fail mode, degraded", i, d, err, want)
				}
			}
			chk.restart()
			deadline := time.Now().Add(10 * time.Second)
			for {
				d, err := c.Check(ctx, orders(u))
				if err == nil && d.Source == client.SourceChecker {
					// The checker counted the one check before the outage and this one.
					if !d.Allowed || d.Remaining != 1 || d.Degraded {
						t.Errorf("after the restart: %+v, want allowed by the checker with 1 left", d)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("10 s after the restart the checker still does not decide: %+v, %v", d, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestDenyCacheCost: the deny cache repeats a denial only for checks costing at least as much
// as the denied one; a cheaper check asks the checker, which may allow it.
func TestDenyCacheCost(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{BatchWait: -1, Timeout: testTimeout})
	ctx := context.Background()
	req := orders(user(t, "u"))
	req.Cost = 2
	for i, want := range []bool{true, false} { // 2 of 3, then 2 more do not fit
		if d, err := c.Check(ctx, req); err != nil || d.Allowed != want || d.Source != client.SourceChecker {
			t.Fatalf("check %d of cost 2 = %+v, %v; want allowed %v by the checker", i, d, err, want)
		}
	}
	if d, err := c.Check(ctx, req); err != nil || d.Allowed || d.Source != client.SourceDenyCache {
		t.Errorf("cost 2 again = %+v, %v; want denied by the deny cache", d, err)
	}
	req.Cost = 1
	if d, err := c.Check(ctx, req); err != nil || !d.Allowed || d.Source != client.SourceChecker || d.Remaining != 0 {
		t.Errorf("cost 1 = %+v, %v; want allowed by the checker, the last unit", d, err)
	}
	// Subjects in another order are the same subjects.
	two := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user(t, "a")}, {Dimension: client.IP, ID: user(t, "ip")}}, Endpoint: "/api/x", Cost: 2}
	if d, err := c.Check(ctx, two); err != nil || !d.Allowed {
		t.Fatalf("ip's 2 of 2 = %+v, %v; want allowed", d, err)
	}
	if d, err := c.Check(ctx, two); err != nil || d.Allowed || d.Source != client.SourceChecker {
		t.Fatalf("ip over its limit = %+v, %v; want denied by the checker", d, err)
	}
	two.Subjects[0], two.Subjects[1] = two.Subjects[1], two.Subjects[0]
	if d, err := c.Check(ctx, two); err != nil || d.Allowed || d.Source != client.SourceDenyCache {
		t.Errorf("same subjects reordered = %+v, %v; want denied by the deny cache", d, err)
	}
}

// TestCheckerFailMode: with Redis gone behind a reachable checker, the checker's own fail mode
// decides; the client reports it as degraded, from the checker, and never caches its denial.
func TestCheckerFailMode(t *testing.T) {
	t.Parallel()
	rs, rdb := checkertest.OwnRedis(t)
	chk := newCheckerOn(t, rdb)
	// The checker decides within its Redis timeout: the client waits for it, so that the
	// checker's fail mode, not the client's, decides.
	c := client.New(chk.url(), client.Config{BatchWait: -1, Timeout: testTimeout})
	req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user(t, "u")}}, Endpoint: "/fm/closed"}
	if d, err := c.Check(context.Background(), req); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("with Redis: %+v, %v; want allowed, not degraded", d, err)
	}
	rs.Stop()
	for i := range 2 {
		calls := chk.calls.Load()
		d, err := c.Check(context.Background(), req)
		if err != nil || d.Allowed || !d.Degraded || d.Source != client.SourceChecker {
			t.Errorf("check %d without Redis: %+v, %v; want denied by the checker's closed fail mode, degraded", i, d, err)
		}
		if chk.calls.Load() == calls {
			t.Errorf("check %d without Redis made no call: a fail mode's denial was cached", i)
		}
	}
}
