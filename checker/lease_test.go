package checker

import (
	"context"
	"encoding/base64"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

const holdRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: inflight, dimension: user, endpoint: /gen, algorithm: concurrency, limit: 3, window: 30s}
  - {id: per-minute, dimension: user, endpoint: /gen, algorithm: fixed_window, limit: 100, window: 1m}
`

// TestHolds: N concurrent checks of a concurrency rule are granted exactly its limit, each with
// a lease; releasing one lets the next in; a second release of it, or a release by a forged or
// unknown id, frees nothing; a renew moves the expiry.
func TestHolds(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, holdRules), DisableOverLimitCache: true})
	user := checkertest.ID(t, "u")
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/gen", Cost: 7}
	ctx := context.Background()
	var mu sync.Mutex
	var holds []*Lease
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			out, err := e.Check(ctx, q)
			if err != nil {
				t.Error(err)
				return
			}
			if out.Allowed != (out.Lease != nil) {
				t.Errorf("allowed %v with lease %v: want a lease exactly when allowed", out.Allowed, out.Lease)
			}
			if out.Lease != nil {
				mu.Lock()
				holds = append(holds, out.Lease)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(holds) != 3 {
		t.Fatalf("10 concurrent checks of 3 places: %d granted, want exactly 3", len(holds))
	}
	if d := time.Until(holds[0].ExpiresAt); d < 25*time.Second || d > 31*time.Second {
		t.Errorf("hold expires in %s, want the rule's 30s", d)
	}
	if out, _ := e.Check(ctx, q); out.Allowed {
		t.Fatal("a 4th check while 3 are held: allowed")
	}
	if err := e.Release(ctx, holds[0].ID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := e.Release(ctx, holds[0].ID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Errorf("second Release: %v, want ErrLeaseNotHeld", err)
	}
	out, err := e.Check(ctx, q)
	if err != nil || !out.Allowed {
		t.Fatalf("after a release: %v, %v; want allowed", out, err)
	}
	exp, err := e.Renew(ctx, holds[1].ID)
	if err != nil || !exp.After(holds[1].ExpiresAt) {
		t.Errorf("Renew: %v, %v; want an expiry after %v", exp, err, holds[1].ExpiresAt)
	}
	// Another holder of the same places (an id with the holder replaced) is refused unread:
	// its signature does not verify.
	_, enc, _ := strings.Cut(holds[2].ID, ".")
	if err := e.Release(ctx, newHolder()+"."+enc); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("Release by another holder: %v, want ErrIDNotIssued", err)
	}
	// A peek takes no place.
	if p, err := e.Peek(ctx, q); err != nil || p.Lease != nil {
		t.Errorf("Peek: hold %v, %v; want none", p.Lease, err)
	}
}

// TestHoldIDRefused: an ID that is malformed, or that names any bucket but a concurrency one (a
// sliding log is a sorted set too), is a FieldError naming lease_id, and reaches no store, even
// signed.
func TestHoldIDRefused(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, holdRules)})
	places := func(lines string) string { return base64.RawURLEncoding.EncodeToString([]byte(lines)) }
	for _, id := range []string{
		"",
		"no-dot",
		"holder.!!!",
		"holder." + places("1000 rl:{user:x}:swl:1m:/gen"),
		"holder." + places("1000 rl:{user:x%7D:cc:}:fw:1m:/gen"),
		"holder." + places("0 rl:{user:x}:cc:30s:/gen"),
		"holder." + places("99999999999 rl:{user:x}:cc:30s:/gen"),
		"holder." + places("1000 other:{user:x}:cc:30s:/gen"),
		strings.Repeat("h", 65) + "." + places("1000 rl:{user:x}:cc:30s:/gen"),
		strings.Repeat("x", 5000),
		"holder." + places(strings.TrimSuffix(strings.Repeat("1000 rl:{user:x}:cc:30s:/gen\n", 17), "\n")),
	} {
		// Signed, as if the engine had issued them, so that the parser is what refuses them
		// (but the empty and the oversized, refused before any signature is computed).
		if id != "" && len(id) < maxHoldID {
			signed, err := e.ids.sign(context.Background(), idKindLease, id)
			if err != nil {
				t.Fatal(err)
			}
			id = signed
		}
		err := e.Release(context.Background(), id)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "lease_id" || strings.Contains(fe.Msg, "signature") {
			t.Errorf("Release(%.60q): %v, want a FieldError naming lease_id, from its parser", id, err)
		}
	}
}

// leaseSink keeps the lease events the engine publishes.
type leaseSink struct {
	mu  sync.Mutex
	got []Released
	sub []Subject
}

func (s *leaseSink) Publish(_ string, q *Query, out *Outcome) {
	if r := out.Released; r != nil {
		s.mu.Lock()
		s.got, s.sub = append(s.got, *r), append(s.sub, q.Subjects...)
		s.mu.Unlock()
	}
}

// TestHoldEvents: a release is published as a lease event of its subject, once (a second
// release publishes nothing); a release of a lease whose place freed itself (in a bucket a
// later place keeps) is published as expired.
func TestHoldEvents(t *testing.T) {
	t.Parallel()
	sink := &leaseSink{}
	e := newEngine(t, Config{DisableOverLimitCache: true, Decisions: sink, Rules: mustRules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: inflight, dimension: user, endpoint: /gen, algorithm: concurrency, limit: 3, window: 1s}
`)})
	ctx := context.Background()
	user := checkertest.ID(t, "u")
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/gen"}
	a, err := e.Check(ctx, q)
	if err != nil || a.Lease == nil {
		t.Fatalf("check: %v, %v", a, err)
	}
	b, _ := e.Check(ctx, q)
	if err := e.Release(ctx, a.Lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, a.Lease.ID); !errors.Is(err, ErrLeaseNotHeld) {
		t.Fatalf("second release: %v", err)
	}
	// A later place keeps the bucket (which expires with its last place) past b's expiry.
	time.Sleep(300 * time.Millisecond)
	if c, err := e.Check(ctx, q); err != nil || c.Lease == nil {
		t.Fatalf("third check: %v, %v", c, err)
	}
	time.Sleep(time.Until(b.Lease.ExpiresAt.Add(100 * time.Millisecond)))
	if err := e.Release(ctx, b.Lease.ID); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("release after the expiry: %v, want ErrLeaseExpired", err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	want := []Released{{LeaseID: a.Lease.ID}, {LeaseID: b.Lease.ID, Expired: true}}
	if len(sink.got) != 2 || sink.got[0] != want[0] || sink.got[1] != want[1] {
		t.Errorf("lease events %+v, want %+v", sink.got, want)
	}
	for _, s := range sink.sub {
		if !reflect.DeepEqual(s, Subject{Dimension: rules.DimensionUser, ID: user}) {
			t.Errorf("lease event of %+v, want the user %s", s, user)
		}
	}
}
