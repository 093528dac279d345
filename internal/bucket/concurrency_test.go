package bucket

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// ccLimit is a algorithm.Concurrency limit of limit places held for ttl, taken by holder.
func ccLimit(k string, limit int64, ttl time.Duration, holder string) Limit {
	return Limit{Key: k, Algorithm: algorithm.Concurrency, Limit: limit, Window: ttl, Holder: holder}
}

// TestConcurrencyExact: N concurrent checks take exactly limit places; a release frees one for
// the next check, a second release of it is ErrNotHeld, never a second free.
func TestConcurrencyExact(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	k := key(t, "cc")
	var held sync.Map
	var n atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			holder := fmt.Sprintf("h%d", i)
			res, err := s.Check(context.Background(), []Request{one(ccLimit(k, 20, time.Minute, holder), 1)})
			if err != nil {
				t.Error(err)
				return
			}
			if res[0].Allowed {
				n.Add(1)
				held.Store(holder, true)
			}
		})
	}
	wg.Wait()
	if got := n.Load(); got != 20 {
		t.Fatalf("200 concurrent acquires of 20 places: %d granted, want exactly 20", got)
	}
	if r := check(t, s, one(ccLimit(k, 20, time.Minute, "late"), 1)); r.Allowed || r.Limits[0].RetryAfter <= 0 {
		t.Fatalf("21st: %+v, want denied with a retry", r.Limits[0])
	}
	var first string
	held.Range(func(h, _ any) bool { first = h.(string); return false })
	if _, err := s.Release(ctxT(t), k, first); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Release(ctxT(t), k, first); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Release: %v, want ErrNotHeld", err)
	}
	if _, err := s.Release(ctxT(t), k, "never-held"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Release of a holder that never held: %v, want ErrNotHeld", err)
	}
	if r := check(t, s, one(ccLimit(k, 20, time.Minute, "after-release"), 1)); !r.Allowed || r.Limits[0].Used != 20 {
		t.Errorf("after one release: %+v, want allowed, 20 held", r.Limits[0])
	}
	if n := serverOf(t, c, k).ZCard(ctxT(t), k).Val(); n != 20 {
		t.Errorf("%d places stored, want 20", n)
	}
}

// TestConcurrencyExpiry: a place never released frees itself at its expiry (a crashed client
// leaks nothing): past it a new check takes it, and the late release is ErrExpired; a renew
// keeps a place past its first expiry.
func TestConcurrencyExpiry(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	later := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: 90 * time.Second}))
	t.Cleanup(func() { later.Close() })
	k := key(t, "cc")
	for _, h := range []string{"crashed", "renewed"} {
		if r := check(t, s, one(ccLimit(k, 2, time.Minute, h), 1)); !r.Allowed {
			t.Fatalf("%s: denied", h)
		}
	}
	if r := check(t, s, one(ccLimit(k, 2, time.Minute, "third"), 1)); r.Allowed {
		t.Fatalf("third: allowed, want denied while both are held")
	}
	exp, err := s.Renew(ctxT(t), k, "renewed", 5*time.Minute)
	if err != nil || time.Until(exp) < 4*time.Minute {
		t.Fatalf("Renew: %v, %v; want an expiry 5 minutes away", exp, err)
	}
	// 90 s later: "crashed" freed itself, "renewed" is still held. A late release says so once;
	// then the place is gone (as once a charge prunes it).
	if _, err := later.Release(ctxT(t), k, "crashed"); !errors.Is(err, ErrExpired) {
		t.Errorf("release of the expired place: %v, want ErrExpired", err)
	}
	if _, err := later.Renew(ctxT(t), k, "crashed", time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Errorf("renew after its expiry was noted: %v, want ErrNotHeld", err)
	}
	if r := check(t, later, one(ccLimit(k, 2, time.Minute, "fourth"), 1)); !r.Allowed || r.Limits[0].Used != 2 {
		t.Errorf("90s later: %+v, want allowed with 2 held (the renewed one and this)", r.Limits[0])
	}
	if _, err := later.Release(ctxT(t), k, "renewed"); err != nil {
		t.Errorf("release of the renewed place: %v", err)
	}
}

// TestConcurrencyAllOrNothing: a check denied by another limit gives its place back, on the
// same subject (one script call) and across subjects (a refund).
func TestConcurrencyAllOrNothing(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	k, full, other := key(t, "cc"), key(t, "fw"), fmt.Sprintf("{%s-other}:fw", t.Name())
	check(t, s, one(lim(full, algorithm.FixedWindow, 1, time.Hour, 0), 1))
	check(t, s, one(lim(other, algorithm.FixedWindow, 1, time.Hour, 0), 1))
	// Same subject: denied by the fixed window, nothing taken.
	r := check(t, s, Request{Cost: 1, Limits: []Limit{ccLimit(k, 5, time.Minute, "a"), lim(full, algorithm.FixedWindow, 1, time.Hour, 0)}})
	if r.Allowed {
		t.Fatal("allowed past a full fixed window")
	}
	// Another subject: taken, then refunded.
	res, err := s.Check(ctxT(t), []Request{one(ccLimit(k, 5, time.Minute, "b"), 1), one(lim(other, algorithm.FixedWindow, 1, time.Hour, 0), 1)})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Refunded || res[1].Allowed {
		t.Fatalf("results %+v, want the place refunded and the other denied", res)
	}
	if n := serverOf(t, c, k).ZCard(ctxT(t), k).Val(); n != 0 {
		t.Errorf("%d places held after denied checks, want 0", n)
	}
	if _, err := s.Check(ctxT(t), []Request{one(ccLimit(k, 5, time.Minute, ""), 1)}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("a concurrency charge without a holder: %v, want ErrInvalidRequest", err)
	}
}

// TestConcurrencyLocal: Local's twin holds places for their whole TTL (it has no releases).
func TestConcurrencyLocal(t *testing.T) {
	t.Parallel()
	l := NewLocal(0)
	now := time.Now()
	for i, want := range []bool{true, true, false} {
		if r := l.Check(now, one(ccLimit("k", 2, time.Minute, fmt.Sprint(i)), 1)); r.Allowed != want {
			t.Errorf("check %d: allowed %v, want %v", i, r.Allowed, want)
		}
	}
	if r := l.Check(now.Add(61*time.Second), one(ccLimit("k", 2, time.Minute, "x"), 1)); !r.Allowed || r.Limits[0].Used != 1 {
		t.Errorf("after the TTL: %+v, want allowed, 1 held", r.Limits[0])
	}
}
