package checker

import (
	"context"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

// ResetRequest names the buckets Engine.Reset deletes: a subject's, for every rule of its
// dimension (whatever the tier), or only for the rules that apply to Endpoint, or only for
// rule RuleID.
type ResetRequest struct {
	// Subject is whose buckets are reset: a user, an IP, an API key, or the global subject
	// (Dimension rules.DimensionGlobal, ID ignored).
	Subject Subject
	// Endpoint, when set, limits the reset to the rules whose pattern matches it, in any tier.
	Endpoint string
	// RuleID, when set, limits the reset to that rule, which must count per Subject's
	// dimension.
	RuleID string
}

// Reset deletes the buckets r names. It returns how many buckets existed and the ids of the
// rules reset. A broken request is a FieldError (identifier, dimension, endpoint, rule_id); with the
// store unreachable it fails with ErrUnavailable: a reset has no fail mode.
func (e *Engine) Reset(ctx context.Context, r ResetRequest) (int64, []string, error) {
	set := e.rules.Load()
	if set == nil {
		return 0, nil, ErrNoRules
	}
	sub := r.Subject
	if sub.Dimension == rules.DimensionGlobal {
		sub = globalSubject
	} else if err := checkSubject(sub, -1); err != nil {
		return 0, nil, err
	}
	ep := r.Endpoint
	if ep != "" {
		var err error
		if ep, err = field.Endpoint(ep, MaxEndpointLen); err != nil {
			return 0, nil, field.Wrap("endpoint", err)
		}
	}
	if id := r.RuleID; id != "" {
		rule, ok := set.Rule(id)
		if !ok {
			return 0, nil, field.Errorf("rule_id", "no rule has id %q", id)
		}
		if rule.Dimension != sub.Dimension {
			return 0, nil, field.Errorf("rule_id", "rule %q counts per %s, not per %s", id, rule.Dimension, sub.Dimension)
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
			r.RuleID != "" && rule.ID != r.RuleID,
			ep != "" && !applies[rule],
			sub.Dimension == rules.DimensionDescriptor && !rule.MatchesDescriptor(sub.Entries):
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
	if e.allotments != nil {
		e.allotments.forget(keys) // the reset bucket's slices start again from the new counter
	}
	n, err := e.guard.delete(ctx, keys)
	if err != nil {
		return 0, nil, err
	}
	return n, ids, nil
}
