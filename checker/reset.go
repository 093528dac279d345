package checker

import (
	"context"

	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Reset deletes the buckets of one subject for every rule of its dimension (whatever the
// tier), or only the rules that apply to an endpoint, or one rule. It returns how many buckets
// existed and the ids of the rules reset. With the store unreachable it fails with
// ErrUnavailable: a reset has no fail mode.
func (e *Engine) Reset(ctx context.Context, r *quotaflowv1.ResetLimitRequest) (int64, []string, error) {
	set := e.rules.Load()
	if set == nil {
		return 0, nil, ErrNoRules
	}
	var sub Subject
	if r.GetDimension() == quotaflowv1.Dimension_DIMENSION_GLOBAL {
		sub = globalSubject
	} else {
		d, err := checkSubject("", r.GetDimension(), r.GetIdentifier())
		if err != nil {
			return 0, nil, err
		}
		sub = Subject{d, r.GetIdentifier()}
	}
	ep := r.GetEndpoint()
	if ep != "" {
		var err error
		if ep, err = NormalizeEndpoint("endpoint", ep); err != nil {
			return 0, nil, err
		}
	}
	if id := r.GetRuleId(); id != "" {
		rule, ok := set.Rule(id)
		if !ok {
			return 0, nil, FieldErrorf("rule_id", "no rule has id %q", id)
		}
		if rule.Dimension != sub.Dimension {
			return 0, nil, FieldErrorf("rule_id", "rule %q counts per %s, not per %s", id, rule.Dimension, sub.Dimension)
		}
	}
	applies := map[*rules.Rule]bool{}
	if ep != "" {
		for _, t := range set.Tiers() {
			for _, rule := range set.Match(sub.Dimension, t.Name, ep) {
				applies[rule] = true
			}
		}
	}
	// An ip subject's buckets are its networks', one per rule's prefix length (ipgroup.go).
	addr, isIP := subjectIP(sub.ID)
	isIP = isIP && sub.Dimension == rules.DimensionIP
	tag := subjectTag(sub.Dimension, sub.ID)
	var keys, ids []string
	seen := map[string]bool{}
	for i := range set.Rules() {
		rule := &set.Rules()[i]
		switch {
		case rule.Dimension != sub.Dimension,
			r.GetRuleId() != "" && rule.ID != r.GetRuleId(),
			ep != "" && !applies[rule]:
			continue
		}
		ids = append(ids, rule.ID)
		if isIP {
			tag = subjectTag(sub.Dimension, networkID(addr, rule))
		}
		if k := limitKey(tag, rule); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return 0, ids, nil
	}
	if e.olc != nil {
		e.olc.forget(keys)
	}
	n, err := e.store.delete(ctx, keys)
	if err != nil {
		return 0, nil, err
	}
	return n, ids, nil
}
