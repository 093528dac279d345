package rulestore

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// applyAll applies doc, removing what it lacks: a whole replacement, as before prune existed.
func applyAll(ctx context.Context, s *Store, doc *rules.Document, actor string) error {
	_, err := s.Apply(ctx, doc, actor, rules.ApplyOptions{Prune: true})
	return err
}

// TestApplyKeepsWhatTheFileNeverHeld: an exemption and a user set through the API survive an
// apply of a file that lacks them unless it prunes; a dry run writes nothing; a pruning apply
// names what it removed in its event.
func TestApplyKeepsWhatTheFileNeverHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, js := newStore(t)
	const file = `rules:
- {id: api, dimension: user, endpoint: /api, algorithm: fixed_window, limit: 10, window: 1m}
`
	if _, err := s.Seed(ctx, mustDecode(t, file)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutExemption(ctx, rules.DocExemption{ID: "acme", Dimension: "user", Value: "acme", Reason: "contract"}, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUserTier(ctx, "bob", "", "ops"); err != nil {
		t.Fatal(err)
	}
	next := mustDecode(t, file+"- {id: new, dimension: user, endpoint: /new, algorithm: fixed_window, limit: 5, window: 1m}\n")
	wantRemoved := []string{"user bob", "exemption acme"}

	for _, opts := range []rules.ApplyOptions{{}, {DryRun: true}} {
		changes, err := s.Apply(ctx, next, "ci", opts)
		if re := (*rules.RemovalError)(nil); !errors.As(err, &re) || !slices.Equal(re.Removed, wantRemoved) {
			t.Fatalf("Apply(%+v) = %v, want a RemovalError naming %v", opts, err, wantRemoved)
		}
		if !slices.Equal(changes.Added, []string{"rule new"}) {
			t.Errorf("Apply(%+v) added %v, want [rule new]", opts, changes.Added)
		}
	}
	set, err := s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Rule("new"); ok || len(set.Document().Exemptions) != 1 {
		t.Fatalf("a refused apply changed the store: rule new %v, exemptions %v", ok, set.Document().Exemptions)
	}

	changes, err := s.Apply(ctx, next, "ci", rules.ApplyOptions{Prune: true, DryRun: true})
	if err != nil || !slices.Equal(changes.Removed, wantRemoved) {
		t.Fatalf("dry run with prune = %+v, %v; want %v removed", changes, err, wantRemoved)
	}
	if set, _ := s.Current(ctx); len(set.Document().Exemptions) != 1 {
		t.Fatal("a dry run changed the store")
	}

	if changes, err = s.Apply(ctx, next, "ci", rules.ApplyOptions{Prune: true}); err != nil || !slices.Equal(changes.Removed, wantRemoved) {
		t.Fatalf("apply with prune = %+v, %v", changes, err)
	}
	set, err = s.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set.Rule("new"); !ok || len(set.Document().Exemptions) != 0 {
		t.Errorf("after the pruning apply: rule new %v, exemptions %v", ok, set.Document().Exemptions)
	}
	var applied []events.ConfigEvent
	for _, m := range natstest.Messages(t, js, events.Stream, events.ConfigPrefix+"."+events.ConfigRulesApplied) {
		var ev events.ConfigEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		applied = append(applied, ev)
	}
	if len(applied) != 1 || !slices.Equal(applied[0].Removed, wantRemoved) {
		t.Errorf("rules_applied events %+v, want one naming %v removed", applied, wantRemoved)
	}
}
