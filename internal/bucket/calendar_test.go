package bucket

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// redisNow is Redis's time, read through a peek of a throwaway fixed window.
func redisNow(t *testing.T, s *Store) time.Time {
	t.Helper()
	return check(t, s, peekReq(lim(key(t, "clock"), algorithm.FixedWindow, 1, time.Hour, 0))).Now
}

// calLimit is a algorithm.CalendarWindow limit of limit units over sp.
func calLimit(k string, limit int64, sp calendar.Span) Limit {
	return Limit{Key: k, Algorithm: algorithm.CalendarWindow, Limit: limit, Window: sp.First, Periods: sp}
}

// TestCalendarWindowBoundary: checks count in the period that holds Redis's time, whatever the
// caller's periods say about its own: a Store whose clock is past the boundary (ClockOffset)
// starts the second period with a fresh count and its real end; the first period's reset is its
// real end; a caller still in the first period afterwards (Redis's clock stepped back) keeps
// the later period's count, erring towards denying.
func TestCalendarWindowBoundary(t *testing.T) {
	t.Parallel()
	before, c := newStore(t)
	now := redisNow(t, before).Truncate(time.Second)
	// The boundary is 30 s ahead; the periods last 17 min then 23 h.
	sp := calendar.Span{Start: now.Add(-17*time.Minute + 30*time.Second), First: 17 * time.Minute, Second: 23 * time.Hour}
	boundary := sp.Start.Add(sp.First)
	after := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: boundary.Sub(now) + time.Second}))
	t.Cleanup(func() { after.Close() })
	k := key(t, "cw")
	l := calLimit(k, 3, sp)

	for i := 1; i <= 3; i++ {
		r := check(t, before, one(l, 1))
		if !r.Allowed || r.Limits[0].Used != int64(i) || !r.Limits[0].ResetAt.Equal(boundary) {
			t.Fatalf("charge %d: %+v, want allowed, used %d, reset at the boundary %s", i, r.Limits[0], i, boundary)
		}
	}
	r := check(t, before, one(l, 1))
	if lr := r.Limits[0]; r.Allowed || lr.RetryAfter <= 0 || lr.RetryAfter > 31*time.Second {
		t.Fatalf("4th charge: %+v, want denied until the boundary (within 31s)", lr)
	}
	// Past the boundary: a new period, with its own end.
	r = check(t, after, one(l, 2))
	if lr := r.Limits[0]; !r.Allowed || lr.Used != 2 || !lr.ResetAt.Equal(boundary.Add(sp.Second)) {
		t.Fatalf("after the boundary: %+v, want allowed, used 2, reset at %s", lr, boundary.Add(sp.Second))
	}
	// Back before it: the later period's count stands.
	r = check(t, before, one(l, 1))
	if lr := r.Limits[0]; !r.Allowed || lr.Used != 3 {
		t.Fatalf("before the boundary again: %+v, want the later period's count (3)", lr)
	}
	if ttl := serverOf(t, c, k).PTTL(ctxT(t), k).Val(); ttl < sp.Second || ttl > sp.Second+time.Minute {
		t.Errorf("key expires in %s, want at the second period's end (%s)", ttl, sp.Second)
	}
}

// TestCalendarWindowSkew: periods that do not hold Redis's time (a caller's clock off by half a
// period or more) fail the call, charging nothing, alone in a batch too.
func TestCalendarWindowSkew(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	now := redisNow(t, s).Truncate(time.Second)
	stale := calendar.Span{Start: now.Add(-3 * time.Hour), First: time.Hour, Second: time.Hour}
	k := key(t, "cw")
	_, err := s.Check(ctxT(t), []Request{one(calLimit(k, 5, stale), 1)})
	if err == nil || !strings.Contains(err.Error(), "calendar periods do not hold Redis's time") {
		t.Fatalf("Check with stale periods: %v, want the skew error", err)
	}
	if n := serverOf(t, c, k).Exists(ctxT(t), k).Val(); n != 0 {
		t.Errorf("the key exists after a failed call")
	}
	if _, err := s.Check(ctxT(t), []Request{one(calLimit(key(t, "bad"), 5, calendar.Span{Start: now, First: 1500 * time.Millisecond, Second: time.Hour}), 1)}); err == nil {
		t.Errorf("Check with periods of fractional seconds: nil error, want an invalid request")
	}
}

// TestCalendarWindowExact: concurrent charges of one calendar limit admit exactly its limit,
// and a denial by another limit of the call gives the calendar charge back.
func TestCalendarWindowExact(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	now := redisNow(t, s).Truncate(time.Second)
	sp := calendar.Period{Unit: calendar.Month}.Around(now)
	l := calLimit(key(t, "cw"), 50, sp)
	if got := raceCharges(t, []*Store{s}, l, 200); got != 50 {
		t.Errorf("200 concurrent charges of a limit of 50: %d allowed, want exactly 50", got)
	}

	// All or nothing: the second request's limit denies, so the first's calendar charge goes back.
	cal := calLimit(key(t, "cw2"), 10, sp)
	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, s, one(full, 1))
	res, err := s.Check(ctxT(t), []Request{one(cal, 4), one(full, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Refunded || res[0].Limits[0].Used != 0 || res[1].Allowed {
		t.Errorf("calendar request of a denied call: %+v, want refunded to 0", res[0])
	}
	if r := check(t, s, peekReq(cal)); r.Limits[0].Used != 0 || r.Limits[0].Remaining != 10 {
		t.Errorf("after the refund: %+v, want 0 used", r.Limits[0])
	}
}

// TestCalendarWindowLocal: Local's twin decides like the script, period by period.
func TestCalendarWindowLocal(t *testing.T) {
	t.Parallel()
	loc := NewLocal(0)
	now := time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	sp := calendar.Period{Unit: calendar.Month}.Around(now)
	l := calLimit("k", 2, sp)
	for i, want := range []bool{true, true, false} {
		if r := loc.Check(now, one(l, 1)); r.Allowed != want || !r.Limits[0].ResetAt.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("check %d in November: %+v, want allowed %v, reset on 1 December", i, r.Limits[0], want)
		}
	}
	dec := now.Add(3 * time.Hour)
	if r := loc.Check(dec, one(l, 1)); !r.Allowed || r.Limits[0].Used != 1 || !r.Limits[0].ResetAt.Equal(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("first check in December: %+v, want allowed, used 1, reset on 1 January", r.Limits[0])
	}
}
