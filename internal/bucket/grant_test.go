package bucket

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// balLimit is a balance of the grants at k over sp, letting charges past zero up to overage
// (0: a hard balance).
func balLimit(k string, overage int64, sp calendar.Span) Limit {
	return Limit{Key: k, Algorithm: algorithm.Balance, Limit: 1 + overage, Window: sp.First, Periods: sp}
}

// put makes grant g at l's key, failing the test on an error.
func put(t *testing.T, s *Store, l Limit, g Grant) Balance {
	t.Helper()
	b, err := s.PutGrant(ctxT(t), l.Key, g, l.Periods)
	if err != nil {
		t.Fatalf("PutGrant(%s): %v", g.ID, err)
	}
	return b
}

// grantsLeft maps each grant of b to what it has left.
func grantsLeft(b Balance) map[string]int64 {
	m := map[string]int64{}
	for _, g := range b.Grants {
		m[g.ID] = g.Remaining
	}
	return m
}

func readBalance(t *testing.T, s *Store, l Limit) Balance {
	t.Helper()
	b, err := s.ReadBalance(ctxT(t), l.Key, l.Periods)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBalanceBurnOrder: four grants burn by priority, then the earliest expiry (never last),
// then the oldest; a hard balance denies past zero until the period ends.
func TestBalanceBurnOrder(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	now := redisNow(t, s)
	sp := calendar.Period{Unit: calendar.Month}.Around(now)
	l := balLimit(key(t, "bl"), 0, sp)
	put(t, s, l, Grant{ID: "plan", Amount: 1000, Priority: 1, Recurring: true})
	put(t, s, l, Grant{ID: "topup", Amount: 2000, Priority: 2})
	put(t, s, l, Grant{ID: "promo", Amount: 500, Priority: 1, Expires: now.AddDate(0, 2, 0)})
	put(t, s, l, Grant{ID: "bonus", Amount: 300, Priority: 1, Expires: now.AddDate(0, 1, 0)})

	for i, tt := range []struct {
		cost    int64
		allowed bool
		want    map[string]int64
	}{
		{900, true, map[string]int64{"bonus": 0, "promo": 0, "plan": 900, "topup": 2000}},
		{1000, true, map[string]int64{"bonus": 0, "promo": 0, "plan": 0, "topup": 1900}},
		{1901, false, map[string]int64{"bonus": 0, "promo": 0, "plan": 0, "topup": 1900}},
		{1900, true, map[string]int64{"bonus": 0, "promo": 0, "plan": 0, "topup": 0}},
	} {
		r := check(t, s, one(l, tt.cost))
		if r.Allowed != tt.allowed {
			t.Fatalf("charge %d of %d: allowed %v, want %v (%+v)", i, tt.cost, r.Allowed, tt.allowed, r.Limits[0])
		}
		if got := grantsLeft(readBalance(t, s, l)); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("after charge %d of %d: grants left %v, want %v", i, tt.cost, got, tt.want)
		}
	}
	r := check(t, s, one(l, 1))
	end := sp.Start.Add(sp.First)
	if !sp.Start.Add(sp.First).After(now) {
		end = end.Add(sp.Second)
	}
	if lr := r.Limits[0]; r.Allowed || lr.Remaining != 0 || lr.Used != 3800 || !lr.ResetAt.Equal(end) {
		t.Errorf("a charge of an empty balance: %+v, want denied, 0 left, 3800 used, reset at the period's end %s", lr, end)
	}
}

// TestBalanceExact: concurrent charges from three stores burn exactly what the grants hold,
// and a soft balance exactly that plus its overage cap; the overage is counted.
func TestBalanceExact(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	stores := []*Store{s}
	for range 2 {
		o := NewStoreWithConfig(c, storeConfig(StoreConfig{}))
		t.Cleanup(func() { o.Close() })
		stores = append(stores, o)
	}
	sp := calendar.Period{Unit: calendar.Day}.Around(redisNow(t, s))
	for _, tt := range []struct {
		name    string
		overage int64
		want    int64
	}{{"hard", 0, 100}, {"soft", 20, 120}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := balLimit(key(t, "bl"), tt.overage, sp)
			put(t, s, l, Grant{ID: "a", Amount: 60, Priority: 1})
			put(t, s, l, Grant{ID: "b", Amount: 40, Priority: 2})
			if got := raceCharges(t, stores, l, 3*64*2); got != tt.want {
				t.Errorf("%d concurrent charges: %d allowed, want exactly %d", 3*64*2, got, tt.want)
			}
			b := readBalance(t, s, l)
			if b.Used != tt.want || b.Overage != tt.overage || b.Remaining() != 0 {
				t.Errorf("balance %+v: want used %d, overage %d, nothing left", b, tt.want, tt.overage)
			}
		})
	}
}

// TestBalanceRollover: past a period's boundary the recurring grant is issued again and what
// it had left rolls over (bounded by max) into a grant that expires with the new period, once,
// however many stores charge first at once; one-off grants stay as they were. The periods are
// a DST day's 23 h and 25 h.
func TestBalanceRollover(t *testing.T) {
	t.Parallel()
	before, c := newStore(t)
	now := redisNow(t, before).Truncate(time.Second)
	sp := calendar.Span{Start: now.Add(-23*time.Hour + 30*time.Second), First: 23 * time.Hour, Second: 25 * time.Hour}
	boundary := sp.Start.Add(sp.First)
	var after []*Store
	for range 3 {
		a := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: boundary.Sub(now) + time.Second}))
		t.Cleanup(func() { a.Close() })
		after = append(after, a)
	}
	l := balLimit(key(t, "bl"), 0, sp)
	put(t, before, l, Grant{ID: "plan", Amount: 100, Priority: 1, Recurring: true, RolloverMax: 30})
	put(t, before, l, Grant{ID: "topup", Amount: 10, Priority: 2})
	if r := check(t, before, one(l, 60)); !r.Allowed {
		t.Fatalf("charge of 60 before the boundary: %+v", r.Limits[0])
	}
	// Past the boundary: 100 issued again, 30 of the 40 left rolled over, the top-up's 10.
	if got := raceCharges(t, after, l, 200); got != 140 {
		t.Errorf("200 concurrent charges past the boundary: %d allowed, want 140 (100 + 30 rolled over + 10)", got)
	}
	b := readBalance(t, after[0], l)
	roll := fmt.Sprintf("plan~%d", boundary.Unix())
	want := map[string]int64{"plan": 0, "topup": 0, roll: 0}
	if got := grantsLeft(b); fmt.Sprint(got) != fmt.Sprint(want) || !b.Period.Equal(boundary) || b.Used != 140 {
		t.Errorf("balance past the boundary: %v, period %s, used %d; want %v, period %s, 140 used", got, b.Period, b.Used, want, boundary)
	}
	for _, g := range b.Grants {
		if g.ID == roll && (!g.Expires.Equal(boundary.Add(sp.Second)) || g.Amount != 30 || g.Recurring) {
			t.Errorf("rollover grant %+v: want 30, once, expiring with the period at %s", g, boundary.Add(sp.Second))
		}
	}
}

// TestBalanceRolloverAfterAGap: a recurring grant last issued two periods ago carries its whole
// amount (bounded by max) into the current one: the period between went unused.
func TestBalanceRolloverAfterAGap(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	now := redisNow(t, s).Truncate(time.Second)
	// Issued in a period that ended an hour ago; the store two periods later.
	sp := calendar.Span{Start: now.Add(-3 * time.Hour), First: 2 * time.Hour, Second: 2 * time.Hour}
	old := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: -2 * time.Hour}))
	t.Cleanup(func() { old.Close() })
	l := balLimit(key(t, "bl"), 0, sp)
	put(t, old, l, Grant{ID: "plan", Amount: 100, Priority: 1, Recurring: true, RolloverMin: 5, RolloverMax: 80})
	check(t, old, one(l, 90)) // 10 left in that period
	later := calendar.Span{Start: sp.Start.Add(4 * time.Hour), First: 2 * time.Hour, Second: 2 * time.Hour}
	lt := balLimit(l.Key, 0, calendar.Span{Start: later.Start.Add(-2 * time.Hour), First: 2 * time.Hour, Second: 2 * time.Hour})
	laterStore := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: 2 * time.Hour}))
	t.Cleanup(func() { laterStore.Close() })
	b := readBalance(t, laterStore, lt)
	if got := grantsLeft(b); got["plan"] != 100 || got[fmt.Sprintf("plan~%d", later.Start.Unix())] != 80 {
		t.Errorf("two periods on: %v, want the plan's 100 and 80 rolled over (its whole amount, at most max)", got)
	}
}

// TestBalanceVoid: a void stops a grant from that instant; what it paid for stays paid.
func TestBalanceVoid(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	l := balLimit(key(t, "bl"), 0, sp)
	put(t, s, l, Grant{ID: "a", Amount: 100, Priority: 1})
	check(t, s, one(l, 30))
	b, err := s.VoidGrant(ctxT(t), l.Key, "a", sp)
	if err != nil || b.Remaining() != 0 || b.Used != 30 || b.Grants[0].Voided.IsZero() || b.Grants[0].Remaining != 70 {
		t.Fatalf("VoidGrant = %+v, %v; want voided with 70 unspent, 30 used, nothing live", b, err)
	}
	if r := check(t, s, one(l, 1)); r.Allowed {
		t.Errorf("a charge after the void: allowed, want denied")
	}
	first := b.Grants[0].Voided
	time.Sleep(2 * time.Millisecond)
	if b, err := s.VoidGrant(ctxT(t), l.Key, "a", sp); err != nil || !b.Grants[0].Voided.Equal(first) {
		t.Errorf("a second void: %+v, %v; want the first instant kept", b, err)
	}
	if _, err := s.VoidGrant(ctxT(t), l.Key, "nope", sp); !errors.Is(err, ErrGrantUnknown) {
		t.Errorf("void of an unknown grant: %v, want ErrGrantUnknown", err)
	}
}

// TestBalanceRefund: a balance charged in a call another limit denies gets every unit back to
// the grants it came from.
func TestBalanceRefund(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	l := balLimit(key(t, "bl"), 5, sp)
	put(t, s, l, Grant{ID: "a", Amount: 3, Priority: 1})
	put(t, s, l, Grant{ID: "b", Amount: 4, Priority: 2})
	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, s, one(full, 1))
	res, err := s.Check(ctxT(t), []Request{one(l, 9), one(full, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Refunded || res[1].Allowed {
		t.Fatalf("results %+v, want the balance's charge refunded", res)
	}
	b := readBalance(t, s, l)
	if got := grantsLeft(b); got["a"] != 3 || got["b"] != 4 || b.Used != 0 || b.Overage != 0 {
		t.Errorf("after the refund: %v, used %d, overage %d; want every grant whole, nothing used", got, b.Used, b.Overage)
	}
}

// TestGrantWrites: a put again is a retry, another grant of that id is refused, and a balance
// holds at most MaxGrants grants.
func TestGrantWrites(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	l := balLimit(key(t, "bl"), 0, sp)
	g := Grant{ID: "a", Amount: 10, Priority: 1, Meta: `{"reason":"pro plan"}`}
	put(t, s, l, g)
	if b := put(t, s, l, g); len(b.Grants) != 1 || b.Grants[0].Remaining != 10 || b.Grants[0].Meta != g.Meta {
		t.Errorf("the same put again: %+v, want the one grant unchanged, its meta kept", b)
	}
	g.Amount = 11
	if _, err := s.PutGrant(ctxT(t), l.Key, g, sp); !errors.Is(err, ErrGrantExists) {
		t.Errorf("another grant of id a: %v, want ErrGrantExists", err)
	}
	for i := 1; i < MaxGrants; i++ {
		put(t, s, l, Grant{ID: fmt.Sprintf("g%d", i), Amount: 1, Priority: 1})
	}
	if _, err := s.PutGrant(ctxT(t), l.Key, Grant{ID: "one-too-many", Amount: 1, Priority: 1}, sp); !errors.Is(err, ErrTooManyGrants) {
		t.Errorf("grant %d: %v, want ErrTooManyGrants", MaxGrants+1, err)
	}
	if _, err := s.PutGrant(ctxT(t), l.Key, Grant{ID: "", Amount: 1}, sp); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("a grant without an id: %v, want ErrInvalidRequest", err)
	}
}

// TestBalanceLocal: Local never decides a balance (its grants live in Redis only): it denies.
func TestBalanceLocal(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	l := balLimit("k", 1000, calendar.Period{Unit: calendar.Month}.Around(now))
	if r := NewLocal(0).Check(now, one(l, 1)); r.Allowed {
		t.Errorf("Local on a balance: %+v, want denied", r)
	}
}

// TestSettleBalance: a reservation of 4 from a balance of 10 (two grants) settled below its
// estimate gives the difference back to the grants it came from; above it, burns more; past
// the balance, burns what there is (and a soft balance its overage cap) and reports the rest
// as an overage not taken, never a debt.
func TestSettleBalance(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	tests := []struct {
		name       string
		overage    int64 // the soft balance's cap; 0: hard
		actual     int64
		wantLeft   map[string]int64
		wantUsed   int64
		wantOver   int64 // the balance's overage after the settle
		wantReport bool  // Settlement.Over
	}{
		{"below", 0, 1, map[string]int64{"a": 5, "b": 4}, 1, 0, false},
		{"equal", 0, 4, map[string]int64{"a": 2, "b": 4}, 4, 0, false},
		{"cancel", 0, 0, map[string]int64{"a": 6, "b": 4}, 0, 0, false},
		{"above", 0, 9, map[string]int64{"a": 0, "b": 1}, 9, 0, false},
		{"past a hard balance", 0, 15, map[string]int64{"a": 0, "b": 0}, 10, 0, true},
		{"into a soft cap", 3, 12, map[string]int64{"a": 0, "b": 0}, 12, 2, false},
		{"past a soft cap", 3, 15, map[string]int64{"a": 0, "b": 0}, 13, 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := balLimit(key(t, "bl"), tt.overage, sp)
			put(t, s, l, Grant{ID: "a", Amount: 6, Priority: 1})
			put(t, s, l, Grant{ID: "b", Amount: 4, Priority: 2})
			rec := l.Key + ":rsv"
			if !reserve(t, s, rec, l, 4) {
				t.Fatal("a reservation of 4 from 10 denied")
			}
			got, err := s.Settle(ctxT(t), []string{rec}, tt.actual, "")
			if err != nil {
				t.Fatalf("Settle: %v", err)
			}
			b := readBalance(t, s, l)
			if left := grantsLeft(b); fmt.Sprint(left) != fmt.Sprint(tt.wantLeft) || b.Used != tt.wantUsed || b.Overage != tt.wantOver {
				t.Errorf("grants %v, used %d, overage %d; want %v, %d, %d", left, b.Used, b.Overage, tt.wantLeft, tt.wantUsed, tt.wantOver)
			}
			if got.Over != tt.wantReport {
				t.Errorf("Settlement.Over = %v, want %v", got.Over, tt.wantReport)
			}
		})
	}
}

// TestUseBalance: usage measured elsewhere burns the grants in order, then overage past what
// the balance allows (the usage happened), once per record: a retry burns nothing and answers
// the first burn's figures.
func TestUseBalance(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	tests := []struct {
		name                   string
		overage                int64 // the soft balance's cap; 0: hard
		amounts                []int64
		wantTaken, wantExcess  int64 // the last use's
		wantLeft, wantUsed, wo int64
	}{
		{"within", 0, []int64{4}, 4, 0, 6, 4, 0},
		{"to zero", 0, []int64{6, 4}, 4, 0, 0, 10, 0},
		{"past a hard balance", 0, []int64{8, 5}, 2, 3, 0, 13, 3},
		{"into a soft cap", 5, []int64{12}, 10, 0, 0, 12, 2},
		{"past a soft cap", 5, []int64{9, 9}, 1, 3, 0, 18, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := balLimit(key(t, "bl"), tt.overage, sp)
			put(t, s, l, Grant{ID: "a", Amount: 6, Priority: 1})
			put(t, s, l, Grant{ID: "b", Amount: 4, Priority: 2})
			var u Use
			for i, n := range tt.amounts {
				var err error
				if u, err = s.UseBalance(ctxT(t), l.Key, fmt.Sprintf("%s#use:%d", l.Key, i), l, n, time.Minute); err != nil || u.Replayed {
					t.Fatalf("use %d of %d: %+v, %v", i, n, u, err)
				}
			}
			if u.Taken != tt.wantTaken || u.Excess != tt.wantExcess {
				t.Errorf("the last use took %d, %d past the allowance; want %d, %d", u.Taken, u.Excess, tt.wantTaken, tt.wantExcess)
			}
			if b := u.Balance; b.Remaining() != tt.wantLeft || b.Used != tt.wantUsed || b.Overage != tt.wo {
				t.Errorf("balance %d left, %d used, %d over; want %d, %d, %d", b.Remaining(), b.Used, b.Overage, tt.wantLeft, tt.wantUsed, tt.wo)
			}
			// The last use again: its record replays it.
			last := len(tt.amounts) - 1
			again, err := s.UseBalance(ctxT(t), l.Key, fmt.Sprintf("%s#use:%d", l.Key, last), l, tt.amounts[last], time.Minute)
			if err != nil || !again.Replayed || again.Taken != u.Taken || again.Excess != u.Excess || again.Balance.Used != tt.wantUsed {
				t.Errorf("a retry: %+v, %v; want replayed, the first's figures, nothing burned", again, err)
			}
		})
	}
	if _, err := s.UseBalance(ctxT(t), key(t, "bl"), "", balLimit(key(t, "bl"), 0, sp), 1, time.Minute); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("a use without a record: %v, want ErrInvalidRequest", err)
	}
}

// TestBalanceThresholds: each threshold is told by the first charge that finds it true, once
// per period (a grant's expiry once per grant), by charges and uses alike; a refunded charge
// tells nothing, and the next charge tells what it would have; concurrent charges tell each
// threshold once.
func TestBalanceThresholds(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	now := redisNow(t, s)
	sp := calendar.Period{Unit: calendar.Month}.Around(now)
	l := balLimit(key(t, "bl"), 0, sp)
	l.Thresholds = ThresholdSpec([]int{50, 80}, []int64{150}, []time.Duration{3 * time.Hour})
	if l.Thresholds != "p50,p80,b150,e10800000" {
		t.Fatalf("ThresholdSpec = %q", l.Thresholds)
	}
	put(t, s, l, Grant{ID: "a", Amount: 100, Priority: 1, Expires: now.Add(2 * time.Hour)})
	put(t, s, l, Grant{ID: "b", Amount: 100, Priority: 2})
	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, s, one(full, 1))
	told := func(ts []Told) string {
		var out []string
		for _, x := range ts {
			out = append(out, fmt.Sprintf("%c%d%s", x.Kind, x.N, map[bool]string{true: ":" + x.Grant}[x.Grant != ""]))
		}
		return fmt.Sprint(out)
	}
	for i, tt := range []struct {
		cost   int64
		refund bool // charged with a full fixed window, which denies: refunded
		want   string
	}{
		{20, true, "[]"},             // would tell a's expiry: refunded, so not
		{20, false, "[e10800000:a]"}, // a expires within 3h
		{30, false, "[]"},            // 50 of 200 used: 25 %; 150 left
		{1, false, "[b150]"},         // 149 left
		{60, false, "[p50]"},         // 111 of 200
		{50, false, "[p80]"},         // 161 of 200
		{10, false, "[]"},            // all told
	} {
		reqs := []Request{one(l, tt.cost)}
		if tt.refund {
			reqs = append(reqs, one(full, 1))
		}
		res, err := s.Check(ctxT(t), reqs)
		if err != nil {
			t.Fatal(err)
		}
		if got := told(res[0].Limits[0].Told()); got != tt.want {
			t.Errorf("charge %d of %d: told %s, want %s", i, tt.cost, got, tt.want)
		}
	}
	// A use tells too: a fresh balance, usage to 90 of 100.
	l2 := balLimit(key(t, "bl2"), 0, sp)
	l2.Thresholds = "p50,p80"
	put(t, s, l2, Grant{ID: "a", Amount: 100})
	u, err := s.UseBalance(ctxT(t), l2.Key, l2.Key+"#use:1", l2, 90, time.Minute)
	if err != nil || told(u.Told) != "[p50 p80]" {
		t.Errorf("a use of 90 of 100: told %s, %v; want p50 and p80", told(u.Told), err)
	}
	if u, _ := s.UseBalance(ctxT(t), l2.Key, l2.Key+"#use:1", l2, 90, time.Minute); u.Told != nil {
		t.Errorf("the use's retry told %s, want nothing", told(u.Told))
	}

	// Concurrent charges of 1 from 100: each threshold told once.
	l3 := balLimit(key(t, "bl3"), 0, sp)
	l3.Thresholds = "p25,p50,p75,p100,b10"
	put(t, s, l3, Grant{ID: "a", Amount: 100})
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				res, err := s.Check(context.Background(), []Request{one(l3, 1)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, x := range res[0].Limits[0].Told() {
					counts[fmt.Sprintf("%c%d", x.Kind, x.N)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if want := map[string]int{"p25": 1, "p50": 1, "p75": 1, "p100": 1, "b10": 1}; fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("160 concurrent charges of 100: told %v, want each once", counts)
	}
}

// TestBalanceMovesAddUp: the moves that charges, a refund, a settle, a use and a new period's
// start report add up, grant by grant, to what each grant has left: the grant ledger can be
// recomputed from them alone.
func TestBalanceMovesAddUp(t *testing.T) {
	t.Parallel()
	before, c := newStore(t)
	now := redisNow(t, before).Truncate(time.Second)
	sp := calendar.Span{Start: now.Add(-23*time.Hour + 30*time.Second), First: 23 * time.Hour, Second: 25 * time.Hour}
	boundary := sp.Start.Add(sp.First)
	after := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: boundary.Sub(now) + time.Second}))
	t.Cleanup(func() { after.Close() })
	l := balLimit(key(t, "bl"), 5, sp)
	ledger := map[string]int64{"plan": 100, "topup": 10, "soon": 20}
	put(t, before, l, Grant{ID: "plan", Amount: 100, Priority: 1, Recurring: true, RolloverMax: 30})
	put(t, before, l, Grant{ID: "soon", Amount: 20, Priority: 2, Expires: boundary.Add(-time.Second)})
	put(t, before, l, Grant{ID: "topup", Amount: 10, Priority: 3})
	overage := int64(0)
	apply := func(ms []Move) {
		for _, m := range ms {
			switch m.Kind {
			case Burned, Forfeited:
				ledger[m.Grant] -= m.N
			case GivenBack, Reissued, RolledOver:
				ledger[m.Grant] += m.N
			case Overage:
				overage += m.N
			case OverageBack:
				overage -= m.N
			}
		}
	}
	charge := func(s *Store, reqs ...Request) Result {
		t.Helper()
		res, err := s.Check(ctxT(t), reqs)
		if err != nil {
			t.Fatal(err)
		}
		apply(res[0].Limits[0].Moves())
		return res[0]
	}
	charge(before, one(l, 60))
	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, before, one(full, 1))
	if r := charge(before, one(l, 7), one(full, 1)); !r.Refunded {
		t.Fatalf("a charge with a full window: %+v, want refunded", r)
	}
	rec := l.Key + ":rsv"
	req := one(l, 10)
	res, err := before.Check(ctxT(t), []Request{req})
	if err != nil || !res[0].Allowed {
		t.Fatal(err)
	}
	apply(res[0].Limits[0].Moves())
	if err := before.Mark(ctxT(t), time.Minute, []Mark{{Key: rec, Request: &req, Result: &res[0], Label: "dGllcg"}}); err != nil {
		t.Fatal(err)
	}
	st, err := before.Settle(ctxT(t), []string{rec}, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	apply(st.Limits[0].Moves())
	u, err := before.UseBalance(ctxT(t), l.Key, l.Key+"#use:1", l, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	apply(u.Moves)
	// Past the boundary: soon expired with 20 unused, plan's 31 forfeited and 100 issued
	// again, 30 rolled over; then all 140 burned, and 3 of overage (a soft cap of 5).
	if r := charge(after, one(l, 140)); !r.Allowed {
		t.Fatalf("a charge of the 140 past the boundary: %+v", r)
	}
	charge(after, one(l, 3))
	b := readBalance(t, after, l)
	left := grantsLeft(b)
	for id, n := range ledger {
		if left[id] != n {
			t.Errorf("grant %s: %d left, the moves say %d (all: %v, moves' %v)", id, left[id], n, left, ledger)
		}
	}
	if roll := fmt.Sprintf("plan~%d", boundary.Unix()); ledger[roll] != 0 || len(ledger) != 4 {
		t.Errorf("the moves' grants: %v, want plan, soon, topup and the rollover %s, all spent", ledger, roll)
	}
	if overage != b.Overage || b.Overage != 3 {
		t.Errorf("overage: the moves say %d, the balance %d; want 3", overage, b.Overage)
	}
}
