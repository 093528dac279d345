package aggregator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

const policyRules = `
default_tier: free
tiers: {free: {}, pro: {}}
policies:
  penalty: {throttled: 400ms, within: 5s, factor: 0.5, duration: 2s}
  tier_protection:
    - {tier: free, capacity: 100, window: 2s, factor: 0.25, duration: 3s}
rules:
  - {id: r1, dimension: user, endpoint: "*", algorithm: token_bucket, limit: 10, window: 1s}
`

// policyStore is a rule store seeded with policyRules on a NATS server of the test's own (the
// store's buckets and the events stream have fixed names).
func policyStore(t *testing.T) (*rulestore.Store, jetstream.JetStream, *rules.Set) {
	t.Helper()
	store, js := rulestoretest.Seeded(t, policyRules)
	set, err := store.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return store, js, set
}

func runPolicies(t *testing.T, cfg aggregator.PolicyConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- aggregator.NewPolicies(cfg).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("policies: %v", err)
		}
	})
}

// overridesWhere is the condition that ok holds of the overrides in force, which it stores in
// *got unless got is nil.
func overridesWhere(store *rulestore.Store, got *[]rules.Override, ok func([]rules.Override) bool) func() error {
	return func() error {
		ovs, err := store.Overrides(context.Background())
		if err != nil {
			return err
		}
		if got != nil {
			*got = ovs
		}
		if !ok(ovs) {
			return fmt.Errorf("overrides %+v", ovs)
		}
		return nil
	}
}

func publishTransition(t *testing.T, js jetstream.JetStream, subject, from, to string, at time.Time) {
	t.Helper()
	tr := events.Transition{ID: subject + from + to + at.String(), Tier: "free", Dimension: "user", Subject: subject, RuleID: "r1", From: from, To: to, At: at, Cause: "decision"}
	if err := events.Publish(context.Background(), js, tr.NATSSubject(), tr.ID, tr); err != nil {
		t.Fatal(err)
	}
}

// TestPenaltyPolicy: a subject throttled longer than the policy allows gets its limit halved
// for the duration, once; a subject throttled briefly does not; the penalty lifts itself.
func TestPenaltyPolicy(t *testing.T) {
	t.Parallel()
	store, js, set := policyStore(t)
	now := time.Now()
	publishTransition(t, js, "abuser", events.StateWarning, events.StateThrottled, now.Add(-time.Second))
	publishTransition(t, js, "brief", events.StateWarning, events.StateThrottled, now.Add(-time.Second))
	publishTransition(t, js, "brief", events.StateThrottled, events.StateWarning, now.Add(-900*time.Millisecond))
	runPolicies(t, aggregator.PolicyConfig{Rules: func() *rules.Set { return set }, Store: store, JetStream: js, Interval: 50 * time.Millisecond})

	var ovs []rules.Override
	poll.Until(t, 20*time.Second, "want a penalty for abuser", overridesWhere(store, &ovs, func(ovs []rules.Override) bool { return len(ovs) > 0 }))
	if len(ovs) != 1 {
		t.Fatalf("overrides = %+v, want one penalty", ovs)
	}
	o := ovs[0]
	if o.Source != "penalty" || o.Dimension != "user" || o.Identifier != "abuser" || o.RuleID != "r1" || o.Multiplier != 0.5 {
		t.Errorf("penalty = %+v, want user abuser on r1 times 0.5 from the penalty policy", o)
	}
	if d := o.ExpiresAt.Sub(o.CreatedAt); d != 2*time.Second {
		t.Errorf("penalty lasts %v, want the policy's 2s", d)
	}
	// The abuser stops being throttled: the penalty expires by itself and is not made again
	// from the throttled time it already paid for.
	publishTransition(t, js, "abuser", events.StateThrottled, events.StateWarning, time.Now())
	poll.Until(t, 20*time.Second, "want the penalty expired", overridesWhere(store, nil, func(ovs []rules.Override) bool { return len(ovs) == 0 }))
	time.Sleep(500 * time.Millisecond)
	if ovs, _ := store.Overrides(context.Background()); len(ovs) != 0 {
		t.Errorf("after the penalty expired: overrides %+v, want none (no second penalty for the same throttled time)", ovs)
	}
}

// TestTierProtectionPolicy: generated decisions of tier free, stored by a real aggregator in
// ClickHouse, push its allowed rate over capacity: the tier's limits are scaled down; when the
// load stops, the override is lifted.
func TestTierProtectionPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("tp")
	store, js, set := policyStore(t)
	runPolicies(t, aggregator.PolicyConfig{
		Rules: func() *rules.Set { return set }, Store: store, JetStream: js, Interval: 100 * time.Millisecond,
		TierRate: aggregator.ClickHouseTierRate(e.ch, e.db),
	})
	// 600 decisions: half of tier free, two thirds of those allowed = 200 > capacity 100.
	e.publish(600, 50)
	var ovs []rules.Override
	poll.Until(t, 20*time.Second, "want tier protection for free", overridesWhere(store, &ovs, func(ovs []rules.Override) bool { return len(ovs) > 0 }))
	o := ovs[0]
	if len(ovs) != 1 || o.Source != "tier_protection" || o.Tier != "free" || o.Multiplier != 0.25 || o.Target() != "tier" {
		t.Fatalf("overrides = %+v, want one tier_protection override of free times 0.25", ovs)
	}
	if limit, _ := set.WithOverrides(ovs).Effective(mustRule(t, set, "r1"), rules.DimensionUser, "u", "free", 0, time.Now()); limit != 3 {
		t.Errorf("r1's effective limit for free under protection = %d, want 10 × 0.25 rounded = 3", limit)
	}
	// No more load: the rate over the 2s window falls to 0 and the policy deletes its override
	// (well before the 3s it would take to expire by itself, since it is checked every 100ms).
	poll.Until(t, 20*time.Second, "want tier protection lifted", overridesWhere(store, nil, func(ovs []rules.Override) bool { return len(ovs) == 0 }))
	// Renewals in between are the same override kept in force while the load lasted.
	if got := overrideActions(t, js, o.ID); strings.ReplaceAll(got, "renewed,", "") != "created,deleted" {
		t.Errorf("events of %s: %s, want created,deleted (lifted by the policy, not left to expire), renewals between", o.ID, got)
	}
}

// overrideActions lists the actions of an override's events on the stream.
func overrideActions(t *testing.T, js jetstream.JetStream, id string) string {
	t.Helper()
	var actions []string
	for _, m := range natstest.Messages(t, js, events.Stream, events.OverridesPrefix+".>") {
		var ev events.OverrideEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Override.ID == id {
			actions = append(actions, ev.Action)
		}
	}
	return strings.Join(actions, ",")
}

func mustRule(t *testing.T, set *rules.Set, id string) *rules.Rule {
	t.Helper()
	r, ok := set.Rule(id)
	if !ok {
		t.Fatalf("no rule %q", id)
	}
	return r
}

// TestTierProtectionRenewsInPlace: while a tier stays over capacity, its protection is renewed
// — the same override, its expiry moved later — and never stacked: two ×0.5 overrides would run
// a limit of 1000 at 250. Renewal happens once less than half the duration is left, so the
// policy fires several times while the test watches.
func TestTierProtectionRenewsInPlace(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, `
default_tier: free
tiers: {free: {}}
policies:
  tier_protection:
    - {tier: free, capacity: 100, window: 1m, factor: 0.5, duration: 2s}
rules:
  - {id: user-api-day, dimension: user, endpoint: /api/*, tier: free, algorithm: fixed_window, limit: 1000, window: 24h}
`)
	set, err := store.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The tier's count stays over capacity for the whole test (the ClickHouse count itself is
	// TestTierProtectionPolicy's).
	overCapacity := func(context.Context, string, time.Time) (int64, error) { return 1000, nil }
	runPolicies(t, aggregator.PolicyConfig{
		Rules: func() *rules.Set { return set }, Store: store, JetStream: js, Interval: 50 * time.Millisecond,
		TierRate: overCapacity,
	})
	var protected []rules.Override
	poll.Until(t, 20*time.Second, "want tier protection for free", overridesWhere(store, &protected, func(ovs []rules.Override) bool { return len(ovs) > 0 }))
	first := protected[0]
	var ovs []rules.Override
	poll.Until(t, 20*time.Second, "want the protection renewed", overridesWhere(store, &ovs, func(ovs []rules.Override) bool {
		if len(ovs) != 1 || ovs[0].ID != first.ID {
			t.Fatalf("overrides = %+v, want only %s, renewed in place", ovs, first.ID)
		}
		return ovs[0].ExpiresAt.After(first.ExpiresAt)
	}))
	if o := ovs[0]; o.Multiplier != 0.5 || !o.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("renewed override = %+v, want ×0.5 made at %v", o, first.CreatedAt)
	}
	// As a checker sees it: the stored set with its overrides.
	cur, err := store.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := cur.Effective(mustRule(t, cur, "user-api-day"), rules.DimensionUser, "u", "free", 0, time.Now()); got != 500 {
		t.Errorf("user-api-day's effective limit for free under protection = %d, want 1000 × 0.5 = 500", got)
	}
	if got := overrideActions(t, js, first.ID); !strings.HasPrefix(got, "created,renewed") || strings.Contains(got, "created,created") {
		t.Errorf("events of %s: %s, want created then renewed", first.ID, got)
	}
}

// TestTierProtectionRemovesStackedOverrides: two protection overrides of one tier — left by a
// version that stacked them, or by two leaders at once — compound (×0.5 twice); the policy keeps
// the newer and deletes the other.
func TestTierProtectionRemovesStackedOverrides(t *testing.T) {
	t.Parallel()
	store, js, set := policyStore(t)
	now := time.Now()
	for i, id := range []string{"tier-protection-old", "tier-protection-new"} {
		o := rules.Override{ID: id, Tier: "free", Multiplier: 0.25, Reason: "stacked", Creator: "policy:tier_protection",
			Source: "tier_protection", CreatedAt: now.Add(time.Duration(i) * time.Millisecond), ExpiresAt: now.Add(time.Minute)}
		if err := store.PutOverride(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	runPolicies(t, aggregator.PolicyConfig{
		Rules: func() *rules.Set { return set }, Store: store, JetStream: js, Interval: 50 * time.Millisecond,
		TierRate: func(context.Context, string, time.Time) (int64, error) { return 1000, nil },
	})
	var ovs []rules.Override
	poll.Until(t, 20*time.Second, "want one override left", overridesWhere(store, &ovs, func(ovs []rules.Override) bool { return len(ovs) == 1 }))
	if ovs[0].ID != "tier-protection-new" {
		t.Errorf("override left = %s, want the newer, tier-protection-new", ovs[0].ID)
	}
}

// TestPenaltyBounds: a wave of throttled subjects is penalized at most MaxPenaltiesPerEvaluation
// at a time and never past MaxActivePenalties in force.
func TestPenaltyBounds(t *testing.T) {
	t.Parallel()
	store, js, set := policyStore(t)
	now := time.Now()
	for i := range 25 {
		publishTransition(t, js, "wave"+strings.Repeat("x", i), events.StateWarning, events.StateThrottled, now.Add(-time.Second))
	}
	runPolicies(t, aggregator.PolicyConfig{Rules: func() *rules.Set { return set }, Store: store, JetStream: js,
		Interval: 500 * time.Millisecond, MaxPenaltiesPerEvaluation: 5, MaxActivePenalties: 12})
	first, most := 0, 0
	for deadline := time.Now().Add(20 * time.Second); most < 12 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ovs, err := store.Overrides(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = len(ovs)
		}
		most = max(most, len(ovs))
	}
	if first > 5 {
		t.Errorf("the first evaluation made %d penalties, want at most 5", first)
	}
	if most != 12 {
		t.Fatalf("at most %d penalties in force, want 12 (25 due, 12 allowed)", most)
	}
	// The penalties in force stay at the bound while the others wait.
	for range 10 {
		if ovs, _ := store.Overrides(context.Background()); len(ovs) > 12 {
			t.Fatalf("%d penalties in force, want at most 12", len(ovs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
