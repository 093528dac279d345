package rulestore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// fingerprint names a set's rules and users, in a stable order.
func fingerprint(s *rules.Set) string {
	var b strings.Builder
	for _, r := range s.Rules() {
		fmt.Fprintf(&b, "rule %s;", r.ID)
	}
	users := s.Users()
	for _, id := range slices.Sorted(maps.Keys(users)) {
		u := users[id]
		fmt.Fprintf(&b, "user %s %s", id, u.Tier)
		for _, rule := range slices.Sorted(maps.Keys(u.Limits)) {
			fmt.Fprintf(&b, " %s=%d", rule, u.Limits[rule])
		}
		b.WriteString(";")
	}
	return b.String()
}

// watcher records every set a Watch applies.
type watcher struct {
	mu   sync.Mutex
	sets []string
}

func (w *watcher) apply(s *rules.Set) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.sets); n == 0 || w.sets[n-1] != s.Document().DefaultTier+fingerprint(s) {
		w.sets = append(w.sets, s.Document().DefaultTier+fingerprint(s))
	}
}

func (w *watcher) seen() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sets)
}

// TestApplyIsAtomic: a watcher following the store while a document that removes rules and
// users, adds others and changes the rest is applied sees the old configuration, then the new
// one, and nothing in between; nor does it log a configuration that does not compile.
func TestApplyIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var logs strings.Builder
	var logMu sync.Mutex
	s, js := newStore(t)
	s.log = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	old := mustDecode(t, `
default_tier: free
tiers: {free: {}, premium: {}}
users:
  alice: {tier: premium}
  bob: {limits: {user-min: 20}}
  dave: {limits: {user-min: 3}}
rules:
  - {id: user-min, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 10, window: 1m}
  - {id: ip-sec, dimension: ip, endpoint: "*", algorithm: gcra, limit: 5, window: 1s}
`)
	next := mustDecode(t, `
default_tier: basic
tiers: {basic: {}, gold: {}}
users:
  bob: {tier: gold, limits: {user-hour: 7}}
  carol: {tier: gold}
  erin: {limits: {user-hour: 1}}
rules:
  - {id: user-hour, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 100, window: 1h}
  - {id: ip-sec, dimension: ip, endpoint: "*", algorithm: gcra, limit: 9, window: 1s}
  - {id: user-min, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 10, window: 1m, tier: gold}
`)
	oldSet, err := old.Compile()
	if err != nil {
		t.Fatal(err)
	}
	nextSet, err := next.Compile()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{old.DefaultTier + fingerprint(oldSet), next.DefaultTier + fingerprint(nextSet)}
	if _, err := s.Seed(ctx, old); err != nil {
		t.Fatal(err)
	}

	// Several watchers, started at different points of the change, each from a store of its
	// own as each checker has.
	var ws []*watcher
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	watch := func() {
		w := new(watcher)
		ws = append(ws, w)
		follower, err := Open(ctx, js, Config{Logger: s.log})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); follower.Watch(wctx, w.apply) }()
	}
	watch()
	poll.Until(t, 10*time.Second, "the first watch applying the set", poll.True(func() bool { return len(ws[0].seen()) == 1 }))
	applied := make(chan error, 1)
	go func() { applied <- applyAll(ctx, s, next, "test") }()
	for range 4 {
		watch()
	}
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	watch() // after the change

	for i, w := range ws {
		poll.Until(t, 10*time.Second, "every watch applying the changed set", poll.True(func() bool { seen := w.seen(); return len(seen) > 0 && seen[len(seen)-1] == want[1] }))
		seen := w.seen()
		if !slices.Equal(seen, want) && !slices.Equal(seen, want[1:]) {
			t.Errorf("watcher %d saw %d configurations:\n  %s\nwant the old, then the new:\n  %s", i, len(seen), strings.Join(seen, "\n  "), strings.Join(want, "\n  "))
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), "does not compile") {
		t.Errorf("a watcher saw a configuration that does not compile:\n%s", logs.String())
	}

	// The store reads as the new document, and holds nothing of the old users.
	cur, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := next.DefaultTier + fingerprint(cur); got != want[1] {
		t.Errorf("Current = %s, want %s", got, want[1])
	}
	keys, err := s.config.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var users int
	for k := range keys.Keys() {
		if strings.HasPrefix(k, userPrefix) {
			users++
		}
	}
	if users != len(next.Users) {
		t.Errorf("%d user keys stored, want the new document's %d", users, len(next.Users))
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestLegacyUserKeys: a store written before generations (users.<id> keys, a document naming
// none) reads, takes a user's change, and moves to a generation at the next Apply.
func TestLegacyUserKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	d := mustDecode(t, doc)
	data, err := json.Marshal(d.WithoutUsers())
	if err != nil {
		t.Fatal(err)
	}
	for id, u := range d.Users {
		b, _ := json.Marshal(u)
		if _, err := s.config.Put(ctx, userPrefix+base64.RawURLEncoding.EncodeToString([]byte(id)), b); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.config.Put(ctx, rulesetKey, data); err != nil {
		t.Fatal(err)
	}
	set, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.TierOf("alice"); got != "premium" {
		t.Errorf("TierOf(alice) = %q, want premium", got)
	}
	if err := s.SetUserTier(ctx, "bob", "premium", "t"); err != nil {
		t.Fatal(err)
	}
	if set, _ = s.Current(ctx); set.TierOf("bob") != "premium" {
		t.Errorf("after SetUserTier on a legacy store: TierOf(bob) = %q, want premium", set.TierOf("bob"))
	}
	if err := applyAll(ctx, s, mustDecode(t, doc), "t"); err != nil {
		t.Fatal(err)
	}
	keys, err := s.config.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		if gen, _, ok := parseUserKey(k); ok && gen == "" {
			t.Errorf("legacy key %s left after Apply", k)
		}
	}
	if set, _ = s.Current(ctx); set.TierOf("alice") != "premium" || set.TierOf("bob") != "free" {
		t.Errorf("after Apply: alice %q, bob %q; want premium, free (the document's)", set.TierOf("alice"), set.TierOf("bob"))
	}
}

// TestSetUserTierDuringApply: a user's change racing an Apply is either replaced by the
// document or made on top of it, never written where no document looks.
func TestSetUserTierDuringApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		var wg sync.WaitGroup
		wg.Add(2)
		var setErr, applyErr error
		go func() { defer wg.Done(); setErr = s.SetUserTier(ctx, "carol", "premium", "t") }()
		go func() { defer wg.Done(); applyErr = applyAll(ctx, s, mustDecode(t, doc), "t") }()
		wg.Wait()
		if setErr != nil || applyErr != nil {
			t.Fatalf("round %d: SetUserTier = %v, Apply = %v", i, setErr, applyErr)
		}
		sn, err := s.read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := s.config.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			if gen, id, ok := parseUserKey(k); ok && gen != sn.gen {
				t.Errorf("round %d: key of user %q of generation %q, which the document (%q) does not name", i, id, gen, sn.gen)
			}
		}
		// Reset carol for the next round.
		if err := applyAll(ctx, s, mustDecode(t, doc), "t"); err != nil {
			t.Fatal(err)
		}
	}
}
