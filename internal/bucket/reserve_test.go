package bucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// reserveLimits is one limit of every algorithm a reservation settles: the counting ones and
// a calendar month.
func reserveLimits(t *testing.T, limit int64) []Limit {
	var ls []Limit
	for _, a := range allAlgorithms {
		ls = append(ls, lim(key(t, a.String()), a, limit, long, 0))
	}
	return append(ls, calLimit(key(t, "cw"), limit, calendar.Period{Unit: calendar.Month}.Around(time.Now())))
}

// reserve charges cost to l and writes the reservation's record; it returns the record's key
// and whether the charge was allowed.
func reserve(t *testing.T, s *Store, rec string, l Limit, cost int64) bool {
	t.Helper()
	req := one(l, cost)
	res := check(t, s, req)
	if !res.Allowed {
		return false
	}
	if err := s.Mark(ctxT(t), time.Minute, []Mark{{Key: rec, Request: &req, Result: &res, Label: "dGllcg"}}); err != nil {
		t.Fatalf("Mark: %v", err)
	}
	return true
}

func remaining(t *testing.T, s *Store, l Limit) int64 {
	t.Helper()
	return check(t, s, peekReq(l)).Limits[0].Remaining
}

// TestSettle: a reservation of 4 of 10 settled at 1 leaves 9; at 4, 6; cancelled, 10; at 15,
// nothing, charged past the limit and reported Over. A second settle changes nothing.
func TestSettle(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	tests := []struct {
		name          string
		actual        int64
		wantRemaining int64
		wantOver      bool
	}{
		{"below", 1, 9, false},
		{"equal", 4, 6, false},
		{"cancel", 0, 10, false},
		{"above", 9, 1, false},
		{"over", 15, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, l := range reserveLimits(t, 10) {
				rec := l.Key + ":rsv"
				if !reserve(t, s, rec, l, 4) {
					t.Fatalf("%v: reserve of 4 of 10 denied", l.Algorithm)
				}
				got, err := s.Settle(ctxT(t), []string{rec}, tt.actual, "")
				if err != nil {
					t.Fatalf("%v: Settle: %v", l.Algorithm, err)
				}
				if got.Estimate != 4 || got.Parts != 1 || got.Over != tt.wantOver || len(got.Limits) != 1 || got.Keys[0] != l.Key || got.Label != "dGllcg" {
					t.Errorf("%v: got %+v, want estimate 4, 1 part, over %v, the limit's key, the label", l.Algorithm, got, tt.wantOver)
				}
				if r := remaining(t, s, l); r != tt.wantRemaining || got.Limits[0].Remaining != r {
					t.Errorf("%v: remaining %d (settle said %d), want %d", l.Algorithm, r, got.Limits[0].Remaining, tt.wantRemaining)
				}
				if _, err := s.Settle(ctxT(t), []string{rec}, tt.actual, ""); !errors.Is(err, ErrSettled) {
					t.Errorf("%v: second settle: got %v, want ErrSettled", l.Algorithm, err)
				}
				if r := remaining(t, s, l); r != tt.wantRemaining {
					t.Errorf("%v: remaining after a second settle %d, want %d", l.Algorithm, r, tt.wantRemaining)
				}
			}
		})
	}
}

func TestSettleErrors(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := ctxT(t)
	if _, err := s.Settle(ctx, []string{key(t, "never")}, 1, ""); !errors.Is(err, ErrUnknownReservation) {
		t.Errorf("unknown: got %v, want ErrUnknownReservation", err)
	}
	for _, tc := range []struct {
		keys   []string
		actual int64
	}{{nil, 1}, {[]string{key(t, "x")}, -1}} {
		if _, err := s.Settle(ctx, tc.keys, tc.actual, ""); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Settle(%v, %d): got %v, want ErrInvalidRequest", tc.keys, tc.actual, err)
		}
	}
	// Redis unreachable: the outcome is unknown, never "unknown reservation" or a success.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer down.Close()
	ds := NewStore(down)
	defer ds.Close()
	if _, err := ds.Settle(ctx, []string{key(t, "r1"), key(t, "r2")}, 1, ""); err == nil || errors.Is(err, ErrUnknownReservation) || !Unavailable(err) {
		t.Errorf("Settle with Redis down: %v, want an unavailable error", err)
	}
	// A label that would not stay one field of the record is refused.
	lr := one(lim(key(t, "lb"), algorithm.FixedWindow, 10, long, 0), 1)
	lres := check(t, s, lr)
	for _, bad := range []string{"two words", "line\nbreak", strings.Repeat("a", 513)} {
		if err := s.Mark(ctx, time.Minute, []Mark{{Key: key(t, "lb") + ":rsv", Request: &lr, Result: &lres, Label: bad}}); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Mark with label %.20q: %v, want ErrInvalidRequest", bad, err)
		}
	}
	// An expired reservation keeps its estimate.
	l := lim(key(t, "fw"), algorithm.FixedWindow, 10, long, 0)
	req := one(l, 4)
	res := check(t, s, req)
	if err := s.Mark(ctx, 50*time.Millisecond, []Mark{{Key: l.Key + ":rsv", Request: &req, Result: &res}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := s.Settle(ctx, []string{l.Key + ":rsv"}, 0, ""); !errors.Is(err, ErrUnknownReservation) {
		t.Errorf("expired: got %v, want ErrUnknownReservation", err)
	}
	if r := remaining(t, s, l); r != 6 {
		t.Errorf("expired: remaining %d, want 6 (the estimate stands)", r)
	}
}

// TestSettleSlidingLogPartial: a partial refund keeps the entry's rest, and later entries'
// sums stay exact: after it, exactly the units left fit.
func TestSettleSlidingLogPartial(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	l := lim(key(t, "swl"), algorithm.SlidingWindowLog, 20, long, 0)
	rec := l.Key + ":rsv"
	if !reserve(t, s, rec, l, 8) {
		t.Fatal("reserve denied")
	}
	check(t, s, one(l, 5)) // an entry after the reservation's
	if _, err := s.Settle(ctxT(t), []string{rec}, 3, ""); err != nil {
		t.Fatal(err)
	}
	if r := remaining(t, s, l); r != 12 {
		t.Fatalf("remaining %d, want 12 (3 + 5 of 20)", r)
	}
	if res := check(t, s, one(l, 12)); !res.Allowed {
		t.Fatal("12 denied, want allowed")
	}
	if res := check(t, s, one(l, 1)); res.Allowed {
		t.Fatal("a 21st unit allowed")
	}
}

// TestReserveExactUnderConcurrency: concurrent reserves of 3 against 100 never exceed it, and
// concurrent settles of each, some retried, refund exactly once.
func TestReserveExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	const L, est, actual, n = 100, 3, 1, 60
	for _, l := range reserveLimits(t, L) {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			s, _ := newStore(t)
			var allowed atomic.Int64
			var recs sync.Map
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					req := one(l, est)
					res, err := s.Check(context.Background(), []Request{req})
					if err != nil || !res[0].Allowed {
						return
					}
					allowed.Add(1)
					rec := fmt.Sprintf("%s:rsv%d", l.Key, i)
					if err := s.Mark(context.Background(), time.Minute, []Mark{{Key: rec, Request: &req, Result: &res[0]}}); err != nil {
						t.Errorf("Mark: %v", err)
					}
					recs.Store(rec, true)
				})
			}
			wg.Wait()
			if got := allowed.Load(); got != L/est {
				t.Fatalf("%d reserves of %d allowed, want exactly %d", got, est, L/est)
			}
			var applied atomic.Int64
			recs.Range(func(k, _ any) bool {
				for range 3 { // each settle sent three times at once
					wg.Go(func() {
						got, err := s.Settle(context.Background(), []string{k.(string)}, actual, "")
						switch {
						case err == nil:
							applied.Add(int64(got.Parts))
						case !errors.Is(err, ErrSettled):
							t.Errorf("Settle: %v", err)
						}
					})
				}
				return true
			})
			wg.Wait()
			if got := applied.Load(); got != L/est {
				t.Errorf("%d settles applied, want %d (one per reservation)", got, L/est)
			}
			if r := remaining(t, s, l); r != L-L/est*actual {
				t.Errorf("remaining %d, want %d", r, L-L/est*actual)
			}
		})
	}
}

// TestSettleOverageBounds: an overage goes whole, past the limit, only to a caller's own
// bucket; a Pooled one (shared by many callers) takes it only as far as it fits and at most
// the estimate again, and OverageCap bounds either. Repeating the attack adds nothing past a
// full pooled bucket. A record written before the bounds is settled whole, as then.
func TestSettleOverageBounds(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t)
	tests := []struct {
		name          string
		pooled        bool
		overageCap    int64
		estimate      int64
		actual        int64
		wantRemaining int64 // of a limit of 10
	}{
		{"own: the whole overage, past the limit", false, 0, 2, 1000, 0},
		{"pooled: at most the estimate again", true, 0, 2, 1000, 6},
		{"pooled: no further than it fits", true, 0, 6, 1000, 0},
		{"pooled: an overage that fits is charged whole", true, 0, 4, 6, 4},
		{"own, capped", false, 3, 2, 1000, 5},
		{"pooled, capped below the estimate", true, 1, 4, 1000, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, l := range reserveLimits(t, 10) {
				l.Pooled, l.OverageCap = tt.pooled, tt.overageCap
				rec := l.Key + ":rsv"
				if !reserve(t, s, rec, l, tt.estimate) {
					t.Fatalf("%v: reserve of %d of 10 denied", l.Algorithm, tt.estimate)
				}
				got, err := s.Settle(ctxT(t), []string{rec}, tt.actual, "")
				if err != nil {
					t.Fatalf("%v: Settle: %v", l.Algorithm, err)
				}
				if !got.Over && tt.actual-tt.estimate > tt.wantRemaining {
					t.Errorf("%v: an overage that did not fit whole was not reported Over", l.Algorithm)
				}
				if r := remaining(t, s, l); r != tt.wantRemaining {
					t.Errorf("%v: remaining %d, want %d", l.Algorithm, r, tt.wantRemaining)
				}
			}
		})
	}
	t.Run("repeated against a pooled bucket", func(t *testing.T) {
		t.Parallel()
		l := lim(key(t, "pool"), algorithm.FixedWindow, 100, long, 0)
		l.Pooled = true
		for i := range 5 {
			rec := fmt.Sprintf("%s:rsv%d", l.Key, i)
			if !reserve(t, s, rec, l, 1) {
				t.Fatalf("reserve %d denied", i)
			}
			if _, err := s.Settle(ctxT(t), []string{rec}, 1_000_000, ""); err != nil {
				t.Fatal(err)
			}
		}
		if r := remaining(t, s, l); r != 90 {
			t.Errorf("after 5 reservations of 1 settled at 1,000,000: remaining %d, want 90 (5 charges and 5 overages of the estimate)", r)
		}
	})
	t.Run("one record of every algorithm", func(t *testing.T) {
		t.Parallel()
		// A settle's 7 arguments per limit: the script must build each limit's module.
		ls := reserveLimits(t, 10)
		tag := "{" + t.Name() + "}"
		for i := range ls {
			ls[i].Key = fmt.Sprintf("%s:%d", tag, i)
			ls[i].Pooled = i%2 == 0
		}
		req := Request{Limits: ls, Cost: 2}
		res := check(t, s, req)
		if !res.Allowed {
			t.Fatal("reserve of 2 of 10 denied")
		}
		rec := tag + ":rsv"
		if err := s.Mark(ctxT(t), time.Minute, []Mark{{Key: rec, Request: &req, Result: &res}}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Settle(ctxT(t), []string{rec}, 100, "")
		if err != nil || len(got.Limits) != len(ls) {
			t.Fatalf("Settle of %d limits: %+v, %v", len(ls), got, err)
		}
		for _, l := range ls {
			want := int64(0) // own: the whole overage
			if l.Pooled {
				want = 6 // the estimate again
			}
			if r := remaining(t, s, l); r != want {
				t.Errorf("%v (pooled %v): remaining %d, want %d", l.Algorithm, l.Pooled, r, want)
			}
		}
	})
	t.Run("a record of before the bounds", func(t *testing.T) {
		t.Parallel()
		l := lim(key(t, "old"), algorithm.FixedWindow, 10, long, 0)
		l.Pooled = true
		rec := l.Key + ":rsv"
		if !reserve(t, s, rec, l, 2) {
			t.Fatal("reserve denied")
		}
		old, err := rdb.Get(ctxT(t), rec).Result()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(old, "\n"), "\n")
		f := strings.Fields(lines[1])
		lines[1] = strings.Join(f[:6], " ")
		if err := rdb.Set(ctxT(t), rec, strings.Join(lines, "\n")+"\n", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Settle(ctxT(t), []string{rec}, 30, ""); err != nil {
			t.Fatal(err)
		}
		if r := remaining(t, s, l); r != 0 {
			t.Errorf("remaining %d after a settle of an old record at 30 of 10, want 0 (charged whole)", r)
		}
	})
}
