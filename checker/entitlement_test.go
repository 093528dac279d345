package checker

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// burnRules: a user's rate limit on /api/*, a hard balance burned by /api/chat or by name, a
// soft one with an overage cap of 5, and a tenant's.
const burnRules = testRules + `entitlements:
  - {id: tokens, dimension: user, endpoints: [/api/chat], period: 1mo, thresholds: {used_percent: [80]}}
  - {id: credits, dimension: user, period: 1d, mode: soft, overage_cap: 5}
  - {id: seats, dimension: tenant, period: 1mo}
`

// grantTo gives subject amount of entitlement in one grant.
func grantTo(t *testing.T, e *Engine, entitlement, subject string, amount int64) {
	t.Helper()
	if _, _, err := e.PutGrant(t.Context(), rules.Grant{Entitlement: entitlement, Subject: subject, Amount: amount, Reason: "test"}); err != nil {
		t.Fatalf("PutGrant(%s, %s, %d): %v", entitlement, subject, amount, err)
	}
}

// balanceOfT is subject's balance of entitlement: what is left, and the period's usage and
// overage.
func balanceOfT(t *testing.T, e *Engine, entitlement, subject string) (left, used, overage int64) {
	t.Helper()
	b, err := e.Balance(t.Context(), entitlement, subject)
	if err != nil {
		t.Fatalf("Balance(%s, %s): %v", entitlement, subject, err)
	}
	return b.Remaining, b.Used, b.Overage
}

// limitOf is the outcome's limit reported under id, nil for none.
func limitOf(out *Outcome, id string) *LimitOutcome {
	for i := range out.Limits {
		if out.Limits[i].Rule.ID == id {
			return &out.Limits[i]
		}
	}
	return nil
}

// TestCheckBurnsBalance: a check burns the balance it names, or its endpoint's, by its cost, in
// the same store call as its rules: all or nothing, a hard balance denying past zero, a soft
// one past zero up to its cap; the answer reports the balance like a limit.
func TestCheckBurnsBalance(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, burnRules), DisableOverLimitCache: true})
	ctx := context.Background()
	user := checkertest.ID(t, "u")
	grantTo(t, e, "tokens", user, 10)
	grantTo(t, e, "credits", user, 3)
	acme := checkertest.ID(t, "acme") // a tenant of the run's own: the package's Redis is shared
	grantTo(t, e, "seats", acme, 2)
	check := func(q Query) *Outcome {
		t.Helper()
		out, err := e.Check(ctx, &q)
		if err != nil {
			t.Fatalf("Check(%+v): %v", q, err)
		}
		return out
	}
	subjects := []Subject{{Dimension: rules.DimensionUser, ID: user}}

	// By endpoint: the rule (burst 4) and the balance both charged 3.
	out := check(Query{Subjects: subjects, Endpoint: "/api/chat", Cost: 3})
	bl := limitOf(out, "tokens")
	if !out.Allowed || bl == nil || bl.Rule.Algorithm != algorithm.Balance || bl.Result.Remaining != 7 || bl.Result.Used != 3 || bl.Limit.Limit != 10 {
		t.Fatalf("a check of /api/chat costing 3: %+v; want allowed, the balance reported 7 left of 10", out)
	}
	if bl.State() != StateNormal {
		t.Errorf("30%% used: state %v, want normal (warning from 80%%)", bl.State())
	}
	// The rule denies (1 of its burst left): the balance is not burned either.
	if out := check(Query{Subjects: subjects, Endpoint: "/api/chat", Cost: 2}); out.Allowed {
		t.Fatalf("a cost of 2 with 1 left of the rule's burst: allowed")
	}
	if left, used, _ := balanceOfT(t, e, "tokens", user); left != 7 || used != 3 {
		t.Errorf("after the rule denied: %d left, %d used; want 7 and 3 (nothing burned)", left, used)
	}
	// By name, on an endpoint no rule matches: the balance alone, down to 0, then denied.
	out = check(Query{Subjects: subjects, Endpoint: "/other", Entitlement: "tokens", Cost: 7})
	if bl := limitOf(out, "tokens"); !out.Allowed || bl.Result.Remaining != 0 || bl.State() != StateWarning {
		t.Fatalf("burning the last 7 by name: %+v; want allowed, 0 left, in warning", out)
	} else if len(bl.Result.Told()) != 1 || bl.Result.Told()[0].Kind != bucket.UsedPercent || bl.Result.Told()[0].N != 80 {
		t.Errorf("the check that used 100 %%: told %+v, want used_percent 80 (once)", bl.Result.Told())
	}
	out = check(Query{Subjects: subjects, Endpoint: "/other", Entitlement: "tokens"})
	if bl := limitOf(out, "tokens"); out.Allowed || bl.Result.RetryAfter <= 0 || bl.State() != StateThrottled {
		t.Fatalf("a check of an empty hard balance: %+v; want denied until the period ends", out)
	}
	// A peek burns nothing; a top-up lets the next check through at once.
	grantTo(t, e, "tokens", user, 5)
	if out, err := e.Peek(ctx, &Query{Subjects: subjects, Endpoint: "/other", Entitlement: "tokens", Cost: 5}); err != nil || !out.Allowed {
		t.Fatalf("a peek of 5 after a top-up of 5: %+v, %v", out, err)
	}
	if left, _, _ := balanceOfT(t, e, "tokens", user); left != 5 {
		t.Errorf("after a peek: %d left, want 5", left)
	}
	// An idempotent retry burns once.
	for range 2 {
		if out := check(Query{Subjects: subjects, Endpoint: "/other", Entitlement: "tokens", Cost: 2, IdempotencyKey: "k1"}); !out.Allowed {
			t.Fatalf("an idempotent check of 2: %+v", out)
		}
	}
	if left, _, _ := balanceOfT(t, e, "tokens", user); left != 3 {
		t.Errorf("after a check and its retry of 2: %d left, want 3", left)
	}
	// Soft: past zero up to the cap of 5, then denied.
	for i, want := range []bool{true, true, false} { // 3 burns the grant, 4 is overage, 2 more would be 6 > 5
		cost := []int64{3, 4, 2}[i]
		if out := check(Query{Subjects: subjects, Endpoint: "/other", Entitlement: "credits", Cost: cost}); out.Allowed != want {
			t.Fatalf("soft check %d costing %d: allowed %v, want %v", i, cost, out.Allowed, want)
		}
	}
	if left, used, over := balanceOfT(t, e, "credits", user); left != 0 || used != 7 || over != 4 {
		t.Errorf("the soft balance: %d left, %d used, %d over; want 0, 7, 4", left, used, over)
	}
	// A custom dimension's balance, held by the check's tenant.
	tenant := []Subject{DescriptorSubject([]rules.Entry{{Key: "tenant", Value: acme}})}
	if out := check(Query{Subjects: tenant, Endpoint: "/x", Entitlement: "seats", Cost: 2}); !out.Allowed {
		t.Fatalf("a tenant's check of its 2 seats: %+v", out)
	}
	if left, _, _ := balanceOfT(t, e, "seats", acme); left != 0 {
		t.Errorf("acme's seats: %d left, want 0", left)
	}
}

// TestCheckEntitlementErrors: a check naming an entitlement that does not exist, or one its
// subjects do not hold, is refused naming the field; one whose endpoint burns an entitlement
// of a subject it does not name is decided by its rules alone.
func TestCheckEntitlementErrors(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, burnRules)})
	ip := []Subject{{Dimension: rules.DimensionIP, ID: "192.0.2.1"}}
	user := []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}
	for _, tt := range []struct {
		name string
		q    Query
		want string // the field error's message, "" for none
	}{
		{"unknown", Query{Subjects: user, Endpoint: "/x", Entitlement: "gold"}, `"gold" is not a declared entitlement`},
		{"no holder", Query{Subjects: ip, Endpoint: "/x", Entitlement: "tokens"}, `"tokens" is held per user, and the check names no user subject`},
		{"no tenant", Query{Subjects: user, Endpoint: "/x", Entitlement: "seats"}, "held per tenant"},
		{"too long", Query{Subjects: user, Endpoint: "/x", Entitlement: string(make([]byte, 65))}, "want an entitlement's id"},
		{"endpoint without holder", Query{Subjects: ip, Endpoint: "/api/chat"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := e.Check(t.Context(), &tt.q)
			var fe *field.Error
			switch {
			case tt.want == "" && (err != nil || !out.Allowed || limitOf(out, "tokens") != nil):
				t.Errorf("got %+v, %v; want allowed by the rules, no balance", out, err)
			case tt.want != "" && (!errors.As(err, &fe) || fe.Field != "entitlement" || !strings.Contains(fe.Msg, tt.want)):
				t.Errorf("got %v, want a field error on entitlement: %s", err, tt.want)
			}
		})
	}
}

// TestBalanceExactUnderConcurrency: three engines, 64 checks in flight each, burn a balance of
// 100 from two grants: a hard one admits exactly 100 units, never one more; a soft one with an
// overage cap of 5 exactly 105, 5 of them overage.
func TestBalanceExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	set := mustRules(t, burnRules)
	engines := make([]*Engine, 3)
	for i := range engines {
		engines[i] = newEngine(t, Config{Rules: set})
	}
	for _, tt := range []struct {
		entitlement string
		admitted    int64
		overage     int64
	}{{"tokens", 100, 0}, {"credits", 105, 5}} {
		t.Run(tt.entitlement, func(t *testing.T) {
			user := checkertest.ID(t, "u")
			grantTo(t, engines[0], tt.entitlement, user, 60)
			grantTo(t, engines[1], tt.entitlement, user, 40)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for _, e := range engines {
				for range 64 {
					wg.Go(func() {
						for range 3 {
							out, err := e.Check(context.Background(), &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}},
								Endpoint: "/other", Entitlement: tt.entitlement})
							if err != nil {
								t.Error(err)
								return
							}
							if out.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
			left, used, over := balanceOfT(t, engines[2], tt.entitlement, user)
			if admitted.Load() != tt.admitted || left != 0 || used != tt.admitted || over != tt.overage {
				t.Errorf("%d admitted, %d left, %d used, %d over; want exactly %d, 0, %d, %d", admitted.Load(), left, used, over,
					tt.admitted, tt.admitted, tt.overage)
			}
		})
	}
}

// TestReserveBalance: a reservation charges its estimate to the balance; its settle gives back
// what the work did not use, to the grants it came from, or burns more up to what there is.
func TestReserveBalance(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, burnRules), DisableOverLimitCache: true})
	ctx := context.Background()
	user := checkertest.ID(t, "u")
	grantTo(t, e, "tokens", user, 100)
	q := func() *Query {
		return &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/other", Entitlement: "tokens",
			Cost: 40, Reserve: time.Minute}
	}
	out, err := e.Check(ctx, q())
	if err != nil || !out.Allowed || out.Reservation == nil {
		t.Fatalf("reserve of 40: %+v, %v", out, err)
	}
	if left, _, _ := balanceOfT(t, e, "tokens", user); left != 60 {
		t.Fatalf("after reserving 40: %d left, want 60", left)
	}
	if st, err := e.Settle(ctx, out.Reservation.ID, 15); err != nil || st.Overage {
		t.Fatalf("settle at 15: %+v, %v", st, err)
	}
	if left, used, _ := balanceOfT(t, e, "tokens", user); left != 85 || used != 15 {
		t.Errorf("after settling at 15: %d left, %d used; want 85, 15", left, used)
	}
	out, _ = e.Check(ctx, q())
	st, err := e.Settle(ctx, out.Reservation.ID, 200)
	if err != nil || !st.Overage {
		t.Fatalf("settle at 200 with 85 left: %+v, %v; want an overage", st, err)
	}
	if left, used, over := balanceOfT(t, e, "tokens", user); left != 0 || used != 100 || over != 0 {
		t.Errorf("after settling past a hard balance: %d left, %d used, %d over; want 0, 100, 0 (no debt)", left, used, over)
	}
}

// usageSink keeps the decisions of the usage it is sent.
type usageSink struct {
	mu  sync.Mutex
	got []Outcome
	qs  []Query
}

func (s *usageSink) Publish(_ string, q *Query, out *Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got, s.qs = append(s.got, *out), append(s.qs, *q)
}

// TestRecordUsage: usage measured elsewhere burns a balance once per event id, past a hard
// balance too (the excess reported, and the next check denied), each record audited as a
// decision; bad fields are named.
func TestRecordUsage(t *testing.T) {
	t.Parallel()
	sink := &usageSink{}
	e := newEngine(t, Config{Rules: mustRules(t, burnRules), Decisions: sink, DisableOverLimitCache: true})
	ctx := context.Background()
	user := checkertest.ID(t, "u")
	grantTo(t, e, "tokens", user, 10)
	use := func(amount int64, id string) Recorded {
		t.Helper()
		r, err := e.RecordUsage(ctx, MeteredUsage{Entitlement: "tokens", Subject: user, Amount: amount, EventID: id, Endpoint: "/v1/chat"})
		if err != nil {
			t.Fatalf("RecordUsage(%d, %s): %v", amount, id, err)
		}
		return r
	}
	if r := use(4, "evt-1"); r.Replayed || r.Taken != 4 || r.Excess != 0 || r.Balance.Remaining != 6 || r.DecisionID == "" {
		t.Fatalf("a use of 4 of 10: %+v", r)
	}
	if r := use(4, "evt-1"); !r.Replayed || r.Taken != 4 || r.Balance.Remaining != 6 {
		t.Fatalf("the same event again: %+v; want replayed, nothing burned", r)
	}
	if r := use(9, "evt-2"); r.Taken != 6 || r.Excess != 3 || r.Balance.Remaining != 0 || r.Balance.Used != 13 || r.Balance.Overage != 3 {
		t.Fatalf("a use of 9 with 6 left: %+v; want 6 taken, 3 past the hard balance", r)
	}
	if out, _ := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/x", Entitlement: "tokens"}); out.Allowed {
		t.Errorf("a check after usage past the balance: allowed, want denied")
	}
	sink.mu.Lock()
	if len(sink.got) < 3 || !sink.got[0].Allowed || !sink.got[1].Replayed || sink.got[2].Allowed ||
		sink.qs[0].Cost != 4 || sink.qs[0].IdempotencyKey != "evt-1" || sink.qs[0].Endpoint != "/v1/chat" || sink.got[0].Limits[0].Rule.ID != "tokens" {
		t.Errorf("the audit: %+v %+v; want the three records as decisions of the balance, the last one not allowed", sink.got, sink.qs)
	}
	sink.mu.Unlock()
	for _, tt := range []struct {
		name  string
		u     MeteredUsage
		field string
		is    error
	}{
		{"no amount", MeteredUsage{Entitlement: "tokens", Subject: user, EventID: "x"}, "amount", nil},
		{"too much", MeteredUsage{Entitlement: "tokens", Subject: user, EventID: "x", Amount: rules.MaxAmount + 1}, "amount", nil},
		{"no event id", MeteredUsage{Entitlement: "tokens", Subject: user, Amount: 1}, "event_id", nil},
		{"no subject", MeteredUsage{Entitlement: "tokens", Amount: 1, EventID: "x"}, "subject", nil},
		{"bad endpoint", MeteredUsage{Entitlement: "tokens", Subject: user, Amount: 1, EventID: "x", Endpoint: "chat"}, "endpoint", nil},
		{"unknown entitlement", MeteredUsage{Entitlement: "gold", Subject: user, Amount: 1, EventID: "x"}, "", rules.ErrNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.RecordUsage(ctx, tt.u)
			var fe *field.Error
			switch {
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Errorf("got %v, want %v", err, tt.is)
			case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
				t.Errorf("got %v, want a field error naming %s", err, tt.field)
			}
		})
	}
}

// TestLeaseBurnsBalance: a check that takes a place in flight and burns a balance does both in
// one store call: its lease's release frees the place and gives nothing of the balance back
// (the call was made); a check denied its place burns nothing.
func TestLeaseBurnsBalance(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, testRules+`  - {id: inflight, dimension: user, endpoint: /stream, algorithm: concurrency, limit: 1, window: 1m}
entitlements:
  - {id: tokens, dimension: user, endpoints: [/stream], period: 1mo}
`), DisableOverLimitCache: true})
	ctx := context.Background()
	user := checkertest.ID(t, "u")
	grantTo(t, e, "tokens", user, 10)
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/stream", Cost: 3}
	out, err := e.Check(ctx, q)
	if err != nil || !out.Allowed || out.Lease == nil {
		t.Fatalf("a check of /stream: %+v, %v; want allowed with a lease", out, err)
	}
	if again, err := e.Check(ctx, q); err != nil || again.Allowed {
		t.Fatalf("a second check while the place is held: %+v, %v; want denied", again, err)
	}
	if left, _, _ := balanceOfT(t, e, "tokens", user); left != 7 {
		t.Errorf("after a check and a denied one: %d left, want 7 (the denied one burned nothing)", left)
	}
	if err := e.Release(ctx, out.Lease.ID); err != nil {
		t.Fatal(err)
	}
	if left, _, _ := balanceOfT(t, e, "tokens", user); left != 7 {
		t.Errorf("after the lease's release: %d left, want 7", left)
	}
	if again, err := e.Check(ctx, q); err != nil || !again.Allowed {
		t.Fatalf("a check after the release: %+v, %v; want allowed", again, err)
	}
}
