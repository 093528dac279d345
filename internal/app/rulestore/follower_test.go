package rulestore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// TestFollowerNATSDownAtStart: a follower started while NATS is down refuses the admin API's
// calls with ErrNotReachable, keeps retrying, seeds and applies the store's rules once NATS
// answers, and then follows every change; a second follower with another seed gets the rules
// the store already holds.
func TestFollowerNATSDownAtStart(t *testing.T) {
	t.Parallel()
	ns, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	ns.Stop()
	js := ns.JetStream(t)
	seed := mustDecode(t, doc)
	f := NewFollower(js, FollowerConfig{Seed: seed, SeedPath: "test.yaml", OpenTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := f.Open(ctx); err == nil {
		t.Fatal("Open with NATS down succeeded")
	}
	if _, err := f.Current(ctx); !errors.Is(err, ErrNotReachable) {
		t.Errorf("Current before the store is open = %v, want ErrNotReachable", err)
	}
	applied := make(chan *rules.Set, 16)
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, func(s *rules.Set) { applied <- s }) }()
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	waitRules := func(want int) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case s := <-applied:
				if len(s.Rules()) == want {
					return
				}
			case <-deadline:
				t.Fatalf("no rule set of %d rules applied within 20s", want)
			}
		}
	}
	waitRules(len(seed.Rules))

	// A write through the follower reaches its own watch.
	if err := f.DeleteRule(ctx, "ip-sec", "alice-ops"); err != nil {
		t.Fatal(err)
	}
	waitRules(len(seed.Rules) - 1)
	evs := readConfigEvents(t, js)
	if len(evs) != 2 || evs[0].Action != "rules_seeded" || evs[1].Action != "rule_deleted" || evs[1].Actor != "alice-ops" || evs[1].RuleID != "ip-sec" {
		t.Errorf("config events %+v, want the seeding, then ip-sec deleted by alice-ops", evs)
	}

	// The store's rules win over another follower's seed.
	other := mustDecode(t, "rules:\n  - {id: only, dimension: user, endpoint: \"*\", algorithm: gcra, limit: 1, window: 1s}\n")
	set, err := NewFollower(js, FollowerConfig{Seed: other}).Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(set.Rules()), len(seed.Rules)-1; got != want {
		t.Errorf("second follower opened %d rules, want the store's %d", got, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after the context ends", err)
	}
}
