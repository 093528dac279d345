package checker

import (
	"context"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// UserUsage is every rule that applies to a user now, with its effective limit and what is
// left of it: the admin API's GET /users/{id}/limits.
type UserUsage struct {
	User string
	Tier string
	// Org is the user's organisation (empty: none), whose org rules follow the user's own in
	// Limits: the budget the user shares with the org's other members.
	Org    string
	Limits []RuleUsage
	// Err says why the remaining quotas are missing (the store unreachable); the limits are
	// listed all the same.
	Err error
}

// RuleUsage is one rule as it applies to a user.
type RuleUsage struct {
	Rule *rules.Rule
	// Custom is the user's own limit for the rule (0: none).
	Custom int64
	// Limit is the effective limit: the rule's, the custom one, overrides applied.
	Limit Limit
	// Result is the bucket's state, peeked without consuming; the zero LimitResult when
	// UserUsage.Err is set.
	Result LimitResult

	thresholds rules.Thresholds // the rule's warning thresholds, for State
}

// State is the limit's warning state as the peek sees it, by the rule a check's limits follow
// (LimitOutcome.State): throttled when one more unit would be denied, warning past the rule's
// warning threshold, else normal. It means nothing while UserUsage.Err is set: nothing was
// peeked.
func (r *RuleUsage) State() State {
	return limitState(r.Result, r.Limit.Limit, r.thresholds)
}

// UserUsage lists the user-dimension rules of the user's tier with their effective limits as
// this engine enforces them (its rule set, overrides applied) and peeks the remaining quota of
// each in the store. At one endpoint pattern, rules naming the tier replace rules naming none,
// as in matching a check.
func (e *Engine) UserUsage(ctx context.Context, user string) (*UserUsage, error) {
	set := e.rules.Load()
	if set == nil {
		return nil, ErrNoRules
	}
	if err := field.Text(user, MaxIdentifierLen); err != nil {
		return nil, field.Wrap("user_id", err)
	}
	tier := set.TierOf(user)
	u, _ := set.User(user)
	now := time.Now()
	out := &UserUsage{User: user, Tier: tier, Org: u.Org}
	// One peek per subject (the user, its org): each lives in its own slot.
	subjects := []Subject{{Dimension: rules.DimensionUser, ID: user}}
	if u.Org != "" {
		subjects = append(subjects, Subject{Dimension: rules.DimensionOrg, ID: u.Org})
	}
	var peeks []bucket.Request
	for _, sub := range subjects {
		tag := subjectTag(sub.Dimension, sub.ID)
		peek := bucket.Request{Cost: 1, Peek: true}
		for _, rule := range applyingRules(set, tier, sub.Dimension) {
			custom := u.Limits[rule.ID] // user rules only: validated so
			lim := bucketLimit(set, rule, limitKey(tag, rule), sub, tier, custom, now)
			out.Limits = append(out.Limits, RuleUsage{Rule: rule, Custom: custom, Limit: lim, thresholds: set.Thresholds(rule.ID)})
			peek.Limits = append(peek.Limits, lim)
		}
		if len(peek.Limits) > 0 {
			peeks = append(peeks, peek)
		}
	}
	if len(peeks) == 0 {
		return out, nil
	}
	results, _, err := e.guard.check(ctx, peeks, nil)
	if err != nil {
		out.Err = err
		return out, nil
	}
	i := 0
	for _, res := range results {
		for _, lr := range res.Limits {
			out.Limits[i].Result = lr
			i++
		}
	}
	return out, nil
}

// applyingRules are the rules of dimension dim and tier: at one endpoint pattern, rules naming
// the tier replace rules naming none (as Set.Match does).
func applyingRules(set *rules.Set, tier string, dim rules.Dimension) []*rules.Rule {
	all := set.Rules()
	tiered := map[string]bool{}
	for i := range all {
		if r := &all[i]; r.Dimension == dim && r.Tier == tier {
			tiered[r.Endpoint] = true
		}
	}
	var out []*rules.Rule
	for i := range all {
		r := &all[i]
		if r.Dimension == dim && (r.Tier == tier || r.Tier == "" && !tiered[r.Endpoint]) {
			out = append(out, r)
		}
	}
	return out
}

// Allowance is a token bucket outside the rules, in a namespace of its own, for quotaflow's
// own use (the admin API's per-token rate limits).
type Allowance struct {
	// Namespace and ID name the bucket's owner; no rule dimension is a namespace, so no
	// subject's bucket can share its key.
	Namespace, ID string
	// Name tells the owner's buckets apart ("read", "write").
	Name string
	// PerMinute is the bucket's rate and capacity.
	PerMinute int64
}

// Take charges one unit to a's bucket, in the store shared by every checker, or in this
// process's own buckets while the store is unreachable.
func (e *Engine) Take(ctx context.Context, a Allowance) (LimitResult, error) {
	return e.allowance(ctx, a, false)
}

// Left reports whether a's bucket would allow one more unit, without charging it.
func (e *Engine) Left(ctx context.Context, a Allowance) (LimitResult, error) {
	return e.allowance(ctx, a, true)
}

func (e *Engine) allowance(ctx context.Context, a Allowance, peek bool) (LimitResult, error) {
	req := bucket.Request{Cost: 1, Peek: peek, Limits: []bucket.Limit{{
		Key:       allowanceKey(a.Namespace, a.ID, a.Name),
		Algorithm: algorithm.TokenBucket, Limit: a.PerMinute, Window: time.Minute, Burst: a.PerMinute,
	}}}
	results, _, err := e.guard.check(ctx, []bucket.Request{req}, allLocal)
	if err != nil {
		return LimitResult{}, err
	}
	return results[0].Limits[0], nil
}
