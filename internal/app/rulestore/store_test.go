package rulestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

const doc = `
default_tier: free
tiers: {free: {}, premium: {}}
users:
  alice: {tier: premium}
  bob: {limits: {user-min: 20}}
rules:
  - {id: user-min, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 10, window: 1m}
  - {id: ip-sec, dimension: ip, endpoint: "*", algorithm: gcra, limit: 5, window: 1s}
`

// newStore opens a store on a fresh JetStream domain of its own: each test gets its own
// server so that buckets do not leak between parallel tests.
func newStore(t testing.TB) (*Store, jetstream.JetStream) {
	t.Helper()
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, js, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s, js
}

func mustDecode(t testing.TB, text string) *rules.Document {
	t.Helper()
	d, err := rules.Decode([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSeedAndWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	if _, err := s.Current(ctx); !errors.Is(err, rules.ErrNotSeeded) {
		t.Fatalf("Current before seeding: err = %v, want rules.ErrNotSeeded", err)
	}
	seeded, err := s.Seed(ctx, mustDecode(t, doc))
	if err != nil || !seeded {
		t.Fatalf("Seed = %v, %v; want true, nil", seeded, err)
	}
	other := mustDecode(t, "rules:\n  - {id: x, dimension: ip, endpoint: \"*\", algorithm: gcra, limit: 1, window: 1s}\n")
	if seeded, err := s.Seed(ctx, other); err != nil || seeded {
		t.Fatalf("second Seed = %v, %v; want false, nil (the store wins)", seeded, err)
	}
	set, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.TierOf("alice"); got != "premium" {
		t.Errorf("TierOf(alice) = %q, want premium", got)
	}
	if u, _ := set.User("bob"); u.Limits["user-min"] != 20 {
		t.Errorf("bob's limits = %v, want user-min 20", u.Limits)
	}

	// Refused writes leave everything as it was.
	bad := []struct {
		name string
		do   func() error
	}{
		{"invalid rule", func() error {
			_, err := s.PutRule(ctx, rules.DocRule{ID: "bad", Dimension: "user", Endpoint: "*", Algorithm: "gcra", Limit: "0", Window: "1s"}, "t")
			return err
		}},
		{"rule a user limit names", func() error { return s.DeleteRule(ctx, "user-min", "t") }},
		{"unknown tier", func() error { return s.SetUserTier(ctx, "carol", "gold", "t") }},
	}
	for _, b := range bad {
		var ve *rules.ValidationError
		if err := b.do(); !errors.As(err, &ve) {
			t.Errorf("%s: err = %v, want a ValidationError", b.name, err)
		}
	}
	if err := s.CreateRule(ctx, rules.DocRule{ID: "ip-sec", Dimension: "ip", Endpoint: "*", Algorithm: "gcra", Limit: "9", Window: "1s"}, "t"); !errors.Is(err, rules.ErrExists) {
		t.Errorf("CreateRule of a used id = %v, want rules.ErrExists", err)
	}
	if err := s.DeleteRule(ctx, "nope", "t"); !errors.Is(err, rules.ErrNotFound) {
		t.Errorf("DeleteRule(nope) = %v, want rules.ErrNotFound", err)
	}
	after, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Rules()) != 2 || after.TierOf("carol") != "free" {
		t.Errorf("after refused writes: %d rules, carol's tier %q; want 2 and free", len(after.Rules()), after.TierOf("carol"))
	}

	// Accepted writes.
	if created, err := s.PutRule(ctx, rules.DocRule{ID: "ip-min", Dimension: "ip", Endpoint: "*", Algorithm: "fixed_window", Limit: "100", Window: "1m"}, "t"); err != nil || !created {
		t.Fatalf("PutRule(ip-min) = %v, %v", created, err)
	}
	if err := s.SetUserTier(ctx, "carol", "premium", "t"); err != nil {
		t.Fatal(err)
	}
	if err := applyAll(ctx, s, mustDecode(t, doc+"  - {id: apikey-h, dimension: apikey, endpoint: \"*\", algorithm: leaky_bucket, limit: 60, window: 1h}\n"), "t"); err != nil {
		t.Fatal(err)
	}
	final, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := final.Rule("apikey-h"); !ok || len(final.Rules()) != 3 {
		t.Errorf("after Apply: %d rules, want the file's 3", len(final.Rules()))
	}
	if _, ok := final.User("carol"); ok {
		t.Error("after Apply: carol, who is not in the file, is still there")
	}
}

func TestConcurrentRuleWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Go(func() {
			_, err := s.PutRule(ctx, rules.DocRule{ID: fmt.Sprintf("r%d", i), Dimension: "apikey", Endpoint: fmt.Sprintf("/p%d", i), Algorithm: "gcra", Limit: "5", Window: "1s"}, "t")
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	set, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(set.Rules()); got != 7 {
		t.Errorf("after 5 concurrent PutRule: %d rules, want 7 (none lost to a race)", got)
	}
}

func TestOverrideLifecycle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, js := newStore(t)
	if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
		t.Fatal(err)
	}
	sets := make(chan *rules.Set, 100)
	go s.Watch(ctx, func(set *rules.Set) { sets <- set })
	go s.PublishExpiries(ctx)
	// nextSetWhere reads the sets the watch delivers until ok accepts one.
	nextSetWhere := func(what string, ok func(*rules.Set) bool) {
		t.Helper()
		for {
			select {
			case set := <-sets:
				if ok(set) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("watch never delivered a set where %s", what)
			}
		}
	}
	nextSetWhere("the seeded rules apply", func(set *rules.Set) bool { return len(set.Rules()) == 2 })

	now := time.Now()
	short := rules.Override{ID: "short", Dimension: "user", Identifier: "alice", Limit: 3, Reason: "test", Creator: "t", Source: "admin", CreatedAt: now, ExpiresAt: now.Add(2 * time.Second)}
	long := rules.Override{ID: "long", Tier: "free", Multiplier: 0.5, Reason: "test", Creator: "t", Source: "admin", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	for _, o := range []rules.Override{short, long} {
		if err := s.PutOverride(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	retried := short
	retried.CreatedAt, retried.ExpiresAt = now.Add(time.Second), now.Add(3*time.Second)
	if err := s.PutOverride(ctx, retried); err != nil {
		t.Errorf("PutOverride retried (same id, same change) = %v, want nil: the stored one stands", err)
	}
	other := short
	other.Limit = 4
	if err := s.PutOverride(ctx, other); !errors.Is(err, rules.ErrExists) {
		t.Errorf("PutOverride of a used id for another change = %v, want rules.ErrExists", err)
	}
	bad := short
	bad.ID, bad.RuleID = "bad", "nope"
	var fe *field.Error
	if err := s.PutOverride(ctx, bad); !errors.As(err, &fe) || fe.Field != "rule_id" {
		t.Errorf("PutOverride naming an unknown rule = %v, want a FieldError on rule_id", err)
	}
	nextSetWhere("both overrides apply", func(set *rules.Set) bool { return len(set.Overrides()) == 2 })
	if err := s.DeleteOverride(ctx, "long", "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteOverride(ctx, "long", "t"); !errors.Is(err, rules.ErrNotFound) {
		t.Errorf("second DeleteOverride = %v, want rules.ErrNotFound", err)
	}
	nextSetWhere("the short one expires by itself", func(set *rules.Set) bool { return len(set.Overrides()) == 0 })
	if ovs, err := s.Overrides(ctx); err != nil || len(ovs) != 0 {
		t.Errorf("Overrides after expiry = %v, %v; want none", ovs, err)
	}

	// The events: created twice, deleted once, expired once.
	want := map[string]int{"created/short": 1, "created/long": 1, "deleted/long": 1, "expired/short": 1}
	got := map[string]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		got = readOverrideEvents(t, ctx, js)
		time.Sleep(50 * time.Millisecond)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("override events %v: want %s once", got, k)
		}
	}
}

func readOverrideEvents(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, m := range natstest.Messages(t, js, events.Stream, events.OverridesPrefix+".>") {
		var ev events.OverrideEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		got[ev.Action+"/"+ev.Override.ID]++
	}
	return got
}

// TestRenewOverride: a renewal moves an override's expiry in place — its per-key TTL with it,
// so the key outlives its first expiry and still expires by itself at the new one — and an
// override that is gone cannot be renewed back.
func TestRenewOverride(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, js := newStore(t)
	if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
		t.Fatal(err)
	}
	go s.PublishExpiries(ctx)
	now := time.Now()
	o := rules.Override{ID: "shed", Tier: "free", Multiplier: 0.5, Reason: "test", Creator: "t", Source: "tier_protection", CreatedAt: now, ExpiresAt: now.Add(2 * time.Second)}
	if err := s.PutOverride(ctx, o); err != nil {
		t.Fatal(err)
	}
	renewed := now.Add(4 * time.Second)
	if err := s.RenewOverride(ctx, o.ID, renewed, "t"); err != nil {
		t.Fatal(err)
	}
	var fe *field.Error
	if err := s.RenewOverride(ctx, o.ID, now, "t"); !errors.As(err, &fe) || fe.Field != "duration" {
		t.Errorf("RenewOverride to a past instant = %v, want a FieldError on duration", err)
	}
	// Past the first expiry (and its TTL's second of slack) the override is still stored, once.
	for time.Now().Before(o.ExpiresAt.Add(1500 * time.Millisecond)) {
		time.Sleep(100 * time.Millisecond)
	}
	ovs, err := s.Overrides(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ovs) != 1 || ovs[0].ID != o.ID || !ovs[0].ExpiresAt.Equal(renewed) || !ovs[0].CreatedAt.Equal(now) {
		t.Fatalf("Overrides after the first expiry = %+v, want %s alone, made at %v, expiring at %v", ovs, o.ID, now, renewed)
	}
	// The new TTL ends it by itself.
	want := map[string]int{"created/shed": 1, "renewed/shed": 1, "expired/shed": 1}
	got := map[string]int{}
	for got["expired/shed"] == 0 && ctx.Err() == nil {
		got = readOverrideEvents(t, ctx, js)
		time.Sleep(50 * time.Millisecond)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("override events %v: want %s once", got, k)
		}
	}
	if err := s.RenewOverride(ctx, o.ID, time.Now().Add(time.Minute), "t"); !errors.Is(err, rules.ErrNotFound) {
		t.Errorf("RenewOverride of an expired override = %v, want rules.ErrNotFound", err)
	}
}

// TestWatchEndsQuietly: a watch whose context ends returns nil, whichever the select sees
// first: ctx.Done, or the watchers' updates, which they close when the context ends.
func TestWatchEndsQuietly(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		wctx, cancel := context.WithCancel(ctx)
		applied := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			done <- s.Watch(wctx, func(*rules.Set) {
				select {
				case applied <- struct{}{}:
				default:
				}
			})
		}()
		<-applied // the watch runs: its initial values arrived
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("round %d: Watch after its context ended = %v, want nil", i, err)
		}
	}
}

// TestUnlessEnded: a watch's failure once its context ended is the watch's end, not an error;
// while the context lives it is an error (the caller restarts the watch).
func TestUnlessEnded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := errors.New("config watcher stopped")
	if err := unlessEnded(ctx, stopped); err != stopped {
		t.Errorf("under a live context: %v, want %v", err, stopped)
	}
	cancel()
	if err := unlessEnded(ctx, stopped); err != nil {
		t.Errorf("once the context ended: %v, want nil", err)
	}
}
