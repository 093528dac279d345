package checker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

const reserveRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: tokens, dimension: user, endpoint: /llm, algorithm: token_bucket, limit: 100, window: 24h}
  - {id: monthly, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 1000, window: 1mo, timezone: Europe/Berlin}
  - {id: inflight, dimension: user, endpoint: /llm, algorithm: concurrency, limit: 50, window: 1m}
  - {id: all, dimension: global, endpoint: /llm, algorithm: sliding_window_log, limit: 1000000, window: 1h}
`

// settleSink keeps the settles the engine publishes.
type settleSink struct {
	mu  sync.Mutex
	got []Settlement
}

func (s *settleSink) Publish(_ string, q *Query, out *Outcome) {
	if st := out.Settlement; st != nil {
		s.mu.Lock()
		s.got = append(s.got, *st)
		s.mu.Unlock()
		if q.Cost != st.Actual-st.Estimate {
			panic("a settle's event has another cost than actual - estimate")
		}
	}
}

func reserveQuery(user string, estimate int64) *Query {
	return &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Cost: estimate, Reserve: time.Minute}
}

// left is what the user's token bucket and monthly window have left (a peek).
func left(t *testing.T, e *Engine, user string) (tokens, monthly int64) {
	t.Helper()
	out, err := e.Peek(context.Background(), &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range out.Limits {
		switch l.Rule.ID {
		case "tokens":
			tokens = l.Result.Remaining
		case "monthly":
			monthly = l.Result.Remaining
		}
	}
	return tokens, monthly
}

// TestReservations: a reserve charges its estimate to every limit of the check (user and
// global slots); a settle charges or refunds the difference, once; a cancel refunds it all;
// an actual past the limits is charged and flagged; bad ids and amounts name their field.
func TestReservations(t *testing.T) {
	t.Parallel()
	sink := &settleSink{}
	e := newEngine(t, Config{Rules: mustRules(t, reserveRules), DisableOverLimitCache: true, Decisions: sink})
	ctx := context.Background()
	user := checkertest.ID(t, "u")

	out, err := e.Check(ctx, reserveQuery(user, 40))
	if err != nil || !out.Allowed || out.Reservation == nil || out.Lease == nil {
		t.Fatalf("reserve of 40: %+v, %v; want allowed with a reservation and a lease", out, err)
	}
	r := out.Reservation
	if r.Estimate != 40 || time.Until(r.ExpiresAt) < 50*time.Second {
		t.Errorf("reservation %+v: want estimate 40, expiring in a minute", r)
	}
	if tk, mo := left(t, e, user); tk != 60 || mo != 960 {
		t.Fatalf("after reserving 40: %d and %d left, want 60 and 960", tk, mo)
	}
	st, err := e.Settle(ctx, r.ID, 10)
	if err != nil || st.Estimate != 40 || st.Actual != 10 || st.Overage || st.Remaining != 90 {
		t.Fatalf("settle at 10: %+v, %v; want estimate 40, no overage, 90 left", st, err)
	}
	if st.Tier != "free" || st.Endpoint != "/llm" || st.RuleID != "tokens" {
		t.Errorf("settle of tier %q, endpoint %q, rule %q; want the reserve's: free, /llm, tokens", st.Tier, st.Endpoint, st.RuleID)
	}
	if tk, mo := left(t, e, user); tk != 90 || mo != 990 {
		t.Errorf("after settling at 10: %d and %d left, want 90 and 990", tk, mo)
	}
	for _, again := range []func() error{
		func() error { _, err := e.Settle(ctx, r.ID, 10); return err },
		func() error { _, err := e.Cancel(ctx, r.ID); return err },
	} {
		if err := again(); !errors.Is(err, ErrReservationSettled) {
			t.Errorf("settle or cancel of a settled reservation: %v, want ErrReservationSettled", err)
		}
	}
	if tk, _ := left(t, e, user); tk != 90 {
		t.Errorf("after a second settle: %d left, want 90 still", tk)
	}

	out, _ = e.Check(ctx, reserveQuery(user, 30))
	if _, err := e.Cancel(ctx, out.Reservation.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if tk, _ := left(t, e, user); tk != 90 {
		t.Errorf("after a cancel: %d left, want 90", tk)
	}

	out, _ = e.Check(ctx, reserveQuery(user, 50))
	st, err = e.Settle(ctx, out.Reservation.ID, 130)
	if err != nil || !st.Overage || st.Remaining != 0 {
		t.Fatalf("settle at 130 of 90 left: %+v, %v; want an overage, 0 left", st, err)
	}
	if out, _ := e.Check(ctx, reserveQuery(user, 1)); out.Allowed {
		t.Error("a reserve after an overage: allowed, want denied (the bucket is in debt)")
	}
	sink.mu.Lock()
	if n := len(sink.got); n != 3 {
		t.Errorf("%d settles published, want 3", n)
	}
	sink.mu.Unlock()

	for _, tc := range []struct {
		name, id, field string
		actual          int64
	}{
		{"empty id", "", "reservation_id", 1},
		{"malformed id", "abc", "reservation_id", 1},
		{"negative actual", r.ID, "actual", -1},
		{"an actual past any cost", r.ID, "actual", MaxCost + 1},
	} {
		var fe *FieldError
		if _, err := e.Settle(ctx, tc.id, tc.actual); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a FieldError naming %s", tc.name, err, tc.field)
		}
	}
	forged := reservationName() + r.ID[len(reservationName()):]
	if _, err := e.Settle(ctx, forged, 1); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("forged id: %v, want ErrIDNotIssued", err)
	}
	for _, q := range []*Query{
		{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Reserve: 25 * time.Hour},
		{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/llm", Reserve: time.Minute, IdempotencyKey: "k"},
	} {
		var fe *FieldError
		if _, err := e.Check(ctx, q); !errors.As(err, &fe) {
			t.Errorf("reserve %+v: %v, want a FieldError", q, err)
		}
	}
}

// TestReservationsExactUnderConcurrency: concurrent reserves of 30 against 100 admit exactly 3,
// and concurrent settles (each sent twice) apply once each.
func TestReservationsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, reserveRules), DisableOverLimitCache: true})
	user := checkertest.ID(t, "u")
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			out, err := e.Check(context.Background(), reserveQuery(user, 30))
			if err != nil {
				t.Error(err)
				return
			}
			if out.Allowed {
				mu.Lock()
				ids = append(ids, out.Reservation.ID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(ids) != 3 {
		t.Fatalf("12 concurrent reserves of 30 against 100: %d allowed, want exactly 3", len(ids))
	}
	var applied atomic.Int64
	for _, id := range ids {
		for range 2 {
			wg.Go(func() {
				_, err := e.Settle(context.Background(), id, 5)
				switch {
				case err == nil:
					applied.Add(1)
				case !errors.Is(err, ErrReservationSettled):
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	if applied.Load() != 3 {
		t.Errorf("%d settles applied, want 3", applied.Load())
	}
	if tk, _ := left(t, e, user); tk != 85 {
		t.Errorf("%d left, want 85 (3 settled at 5)", tk)
	}
}

// TestReservationIDRefused: hostile ids are refused before any store call, naming
// reservation_id: too long, too many slots, a slot that is no subject's, no expiry.
func TestReservationIDRefused(t *testing.T) {
	t.Parallel()
	name := reservationName()
	slots := func(tags ...string) string { return reservationID(name, time.Now(), tags) }
	many := make([]string, maxReservationParts+1)
	for i := range many {
		many[i] = "{user:u" + string(rune('a'+i)) + "}"
	}
	tests := []struct{ name, id string }{
		{"too many slots", slots(many...)},
		{"a slot that is no subject's", slots("user:alice")},
		{"a slot with a second brace", slots("{user:a}b}")},
		{"no expiry", name + "..e3VzZXI6YX0"},
		{"no slots", name + ".1."},
		{"two parts", name + ".1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var fe *FieldError
			if _, _, err := parseReservationID(tt.id); !errors.As(err, &fe) || fe.Field != "reservation_id" {
				t.Errorf("parseReservationID(%.60q): %v, want a FieldError naming reservation_id", tt.id, err)
			}
		})
	}
	// An id too long is refused before its signature is computed.
	e := newEngine(t, Config{Rules: mustRules(t, reserveRules)})
	var fe *FieldError
	if _, err := e.Settle(context.Background(), name+"."+strings.Repeat("1", maxReservationID), 1); !errors.As(err, &fe) ||
		fe.Field != "reservation_id" || !strings.Contains(fe.Msg, "longer than") {
		t.Errorf("settle of an id too long: %v, want a FieldError naming reservation_id", err)
	}
	if keys, _, err := parseReservationID(slots("{user:a}", "{global}")); err != nil || len(keys) != 2 || keys[1] != "rl:{global}:rsv:"+name {
		t.Errorf("a well-formed id: %v, %v", keys, err)
	}
}

// markFailStore is the real store whose records of reservations cannot be written.
type markFailStore struct{ *bucket.Store }

func (markFailStore) Mark(context.Context, time.Duration, []bucket.Mark) error {
	return errors.New("test: the record's write failed")
}

// decisionCount counts the decisions published.
type decisionCount struct{ n atomic.Int64 }

func (c *decisionCount) Publish(string, *Query, *Outcome) { c.n.Add(1) }

// TestReservationNotRecorded: when a reservation's record cannot be written, the check it
// charged is still answered allowed (with no reservation: nothing can settle it, its estimate
// stands) and recorded as a decision, never an error after a charge.
func TestReservationNotRecorded(t *testing.T) {
	t.Parallel()
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	store := bucket.NewStore(rdb)
	t.Cleanup(func() { store.Close() })
	sink := &decisionCount{}
	e := newEngine(t, Config{store: markFailStore{store}, Decisions: sink, Rules: mustRules(t, reserveRules), DisableOverLimitCache: true})
	user := checkertest.ID(t, "u")
	out, err := e.Check(context.Background(), reserveQuery(user, 30))
	if err != nil || !out.Allowed || out.Reservation != nil {
		t.Fatalf("reserve whose record fails: %+v, %v; want allowed with no reservation", out, err)
	}
	if n := sink.n.Load(); n != 1 {
		t.Errorf("%d decisions published, want the reserve's", n)
	}
	if tk, _ := left(t, e, user); tk != 70 {
		t.Errorf("%d left, want 70: the estimate stands", tk)
	}
}

// TestSettleOverageAttack: a caller reserves 1 for throwaway users and settles each at
// 1,000,000. The overage goes whole to each throwaway user's own bucket, and only as far as
// the estimate again to the global bucket all callers share, so that alice and bob, checking
// beside the attack, are still allowed exactly their own limits.
func TestSettleOverageAttack(t *testing.T) {
	t.Parallel()
	global := checkertest.ID(t, "global")
	e := newEngine(t, Config{DisableOverLimitCache: true, Rules: mustRules(t, `rules:
- {id: `+global+`, dimension: global, endpoint: /llm, algorithm: token_bucket, limit: 1000, window: 1m}
- {id: user-llm, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 10, window: 1h}
`)})
	ctx := context.Background()
	victims := []string{checkertest.ID(t, "alice"), checkertest.ID(t, "bob")}
	allowed := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, v := range victims {
		wg.Go(func() {
			for range 12 {
				out, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: v}}, Endpoint: "/llm", Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if out.Allowed {
					mu.Lock()
					allowed[v]++
					mu.Unlock()
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	for i := range 5 {
		attacker := checkertest.ID(t, fmt.Sprintf("throwaway%d", i))
		out, err := e.Check(ctx, reserveQuery(attacker, 1))
		if err != nil || !out.Allowed || out.Reservation == nil {
			t.Fatalf("the attacker's reserve: %+v, %v", out, err)
		}
		st, err := e.Settle(ctx, out.Reservation.ID, 1_000_000)
		if err != nil || !st.Overage {
			t.Fatalf("the attacker's settle at 1,000,000: %+v, %v; want it done, flagged overage", st, err)
		}
		if out, _ := e.Check(ctx, reserveQuery(attacker, 1)); out == nil || out.Allowed {
			t.Errorf("%s after its overage: %+v, want denied by its own debt", attacker, out)
		}
	}
	wg.Wait()
	for _, v := range victims {
		if allowed[v] != 10 {
			t.Errorf("%s was allowed %d of 12 beside the attack, want its own limit, 10", v, allowed[v])
		}
	}
	out, err := e.Peek(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "carol")}}, Endpoint: "/llm"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range out.Limits {
		// 5 reserves of 1, 5 overages of 1, 20 victims' checks, and 5 denied re-reserves charge
		// nothing: a bucket of 1000 refilling over the test holds at least 1000 - 30.
		if l.Rule.ID == global && l.Result.Remaining < 970 {
			t.Errorf("the global bucket has %d left after the attack, want at least 970", l.Result.Remaining)
		}
	}
}
