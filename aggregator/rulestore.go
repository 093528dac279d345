package aggregator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/retry"
)

// RuleStore is what the aggregator needs of the rule store (rulestore.Store): the rule set whose
// warning thresholds and policies it applies, the overrides its policies make, and the expiry
// events of overrides.
type RuleStore interface {
	OverrideStore
	// Current returns the stored rule set; rules.ErrNotSeeded when no rules were ever stored.
	Current(ctx context.Context) (*rules.Set, error)
	// Watch calls apply with the rule set once it is read and after every change, until ctx
	// ends; it returns early with an error when the store cannot be followed.
	Watch(ctx context.Context, apply func(*rules.Set)) error
	// PublishExpiries publishes an "expired" event for every override whose TTL ends while it
	// runs, until ctx ends; it returns early with an error when the store cannot be followed.
	PublishExpiries(ctx context.Context) error
}

// rulesWait bounds how long Run waits for a seeded store's rules: past it the aggregator
// consumes with the default thresholds rather than not at all.
const rulesWait = 10 * time.Second

// startRuleTasks starts the tasks that live off the rule store, each restarted when it stops
// early: following the rule set (the warning thresholds and the policies), publishing the
// overrides' expiry events and running the policies (penalty, tier protection; only the leader
// writes). When the store holds rules it returns once they are loaded (or after rulesWait), so
// that the first decision is judged by the configured thresholds rather than the defaults. The
// returned function stops the tasks and waits for them. Without a RuleStore there are none.
func (a *Aggregator) startRuleTasks(ctx context.Context) (stop func()) {
	store := a.cfg.RuleStore
	if store == nil {
		return func() {}
	}
	cctx, cancel := context.WithTimeout(ctx, rulesWait)
	_, err := store.Current(cctx)
	cancel()
	seeded := err == nil
	if err != nil && !errors.Is(err, rules.ErrNotSeeded) && ctx.Err() == nil {
		a.log.Warn("rule store unreadable; warning thresholds are the defaults until it is", "err", err)
	}

	ctx, cancelTasks := context.WithCancel(ctx)
	var wg sync.WaitGroup
	loaded := make(chan struct{})
	var once sync.Once
	wg.Go(func() {
		retry.Forever(ctx, a.log, "follow the rule store", func(ctx context.Context) error {
			return store.Watch(ctx, func(s *rules.Set) {
				a.set.Store(s)
				once.Do(func() { close(loaded) })
			})
		})
	})
	if seeded {
		wctx, cancel := context.WithTimeout(ctx, rulesWait)
		select {
		case <-loaded:
		case <-wctx.Done():
			if ctx.Err() == nil {
				a.log.Warn("rules not loaded yet; warning thresholds are the defaults until they are")
			}
		}
		cancel()
	}
	wg.Go(func() { retry.Forever(ctx, a.log, "publish override expiries", store.PublishExpiries) })
	policies := NewPolicies(PolicyConfig{
		Rules: a.rules, Store: store, JetStream: a.js, TierRate: ClickHouseTierRate(a.ch, a.cfg.Database),
		Leader: a.Leader, Interval: a.cfg.PolicyInterval, Logger: a.cfg.Logger, Meter: a.cfg.Meter,
	})
	wg.Go(func() { retry.Forever(ctx, a.log, "run the policies", policies.Run) })
	return func() {
		cancelTasks()
		wg.Wait()
	}
}
