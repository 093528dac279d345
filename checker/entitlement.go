package checker

import (
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// A check burns an entitlement's balance in the same store call as its rules' limits: the
// balance is one more request of the plan, of one limit of algorithm.Balance (its Rule, which
// reports under the entitlement's id), charged the check's cost and refunded with the others
// when any enforced limit denies, so that a balance is never burned by a denied check nor a
// check admitted past a hard balance. The entitlements a check burns are the one it names
// (Query.Entitlement) and those whose endpoints match its endpoint; each is burned from the
// balance of the check's subject of the entitlement's dimension.

// entitlements plans the balances q burns. A check that names an entitlement must name a
// subject that holds it; one that only calls a metered endpoint burns the entitlements whose
// holder it names, as a rule applies only to the checks that name its dimension.
func (p *planner) entitlements() error {
	named := p.q.Entitlement
	if named != "" {
		ent, ok := p.set.Entitlement(named)
		if !ok {
			return field.Errorf("entitlement", "%q is not a declared entitlement", named)
		}
		sub, ok := holder(p.set, p.q, ent)
		if !ok {
			return field.Errorf("entitlement", "%q is held per %s, and the check names no %s subject", named, holderName(ent), holderName(ent))
		}
		p.balance(ent, sub)
	}
	if p.q.SkipGlobal {
		// A later query of one incoming request (Envoy's descriptors): its first burned them.
		return nil
	}
	ents := p.set.Entitlements()
	for i := range ents {
		ent := &ents[i]
		if ent.ID == named || !ent.Burns(p.q.Endpoint) {
			continue
		}
		if sub, ok := holder(p.set, p.q, ent); ok {
			p.balance(ent, sub)
		}
	}
	return nil
}

// balance plans one request charging sub's balance of ent the check's cost. A cost above the
// balance is a denial, not a bad request: a top-up may come at any time.
func (p *planner) balance(ent *rules.Entitlement, sub Subject) {
	lims := []bucket.Limit{balanceLimit(ent, sub, p.now)}
	p.pl.reqs = append(p.pl.reqs, bucket.Request{Limits: lims, Cost: p.q.Cost, Peek: p.peek})
	p.pl.first = append(p.pl.first, len(p.out.Limits))
	p.out.Limits = append(p.out.Limits, LimitOutcome{Rule: ent.Rule(), Subject: sub, Limit: &lims[0], thresholds: ent.Warning()})
}

// balanceLimit is sub's balance of ent as a limit of the store, in the periods around now:
// its Limit is 1 + what it lets past zero (1 for a hard balance).
func balanceLimit(ent *rules.Entitlement, sub Subject, now time.Time) bucket.Limit {
	overage := int64(0)
	if ent.Soft {
		overage = ent.OverageCap
		if overage == rules.NoCap {
			overage = rules.MaxAmount
		}
	}
	t := &ent.Thresholds
	return bucket.Limit{Key: balanceKey(ent, sub), Algorithm: algorithm.Balance, Limit: 1 + overage,
		Window: ent.Period.Unit.Nominal(), Periods: ent.Period.Around(now), Pooled: !sub.Dimension.Own(),
		Thresholds: bucket.ThresholdSpec(t.UsedPercent, t.BalanceBelow, t.ExpiringWithin)}
}

// holder is q's subject that holds ent's balances: its user, API key, org (its user's, else its
// API key's), or the entry of its descriptor that names ent's custom dimension.
func holder(set *rules.Set, q *Query, ent *rules.Entitlement) (Subject, bool) {
	var id string
	switch ent.Dimension {
	case rules.DimensionOrg:
		id = set.OrgOf(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey))
	case rules.DimensionDescriptor:
		for _, sub := range q.Subjects {
			for _, e := range sub.Entries {
				if e.Key == ent.Key && e.Value != "" {
					return customSubject(ent.Key, e.Value), true
				}
			}
		}
	default:
		id = subjectOf(q, ent.Dimension)
	}
	return Subject{Dimension: ent.Dimension, ID: id}, id != ""
}

// customSubject is the subject of one value of a custom dimension: the descriptor of that one
// entry, as a rule of the dimension counts it.
func customSubject(key, value string) Subject {
	return DescriptorSubject([]rules.Entry{{Key: key, Value: value}})
}

// holderOf is the subject id names among ent's holders: a custom dimension's value, or a
// user's, API key's or org's id.
func holderOf(ent *rules.Entitlement, id string) Subject {
	if ent.Dimension == rules.DimensionDescriptor {
		return customSubject(ent.Key, id)
	}
	return Subject{Dimension: ent.Dimension, ID: id}
}

// holderName names the kind of subject that holds ent's balances.
func holderName(ent *rules.Entitlement) string {
	if ent.Key != "" {
		return ent.Key
	}
	return ent.Dimension.String()
}

// balanceKey is the key of sub's balance of ent: rl:{dim:id}:bl:<entitlement>, under the tag of
// the subject's other buckets (a custom dimension's: its descriptor "name=value"), so that a
// check burns it in the same slot as the subject's rules.
func balanceKey(ent *rules.Entitlement, sub Subject) string {
	return "rl:" + subjectTag(sub.Dimension, sub.ID) + ":bl:" + ent.ID
}

// balanceView is what an answer reports as a balance's limit: what the period had, used and
// left (the store's Limit is 1 + the overage cap, which no reader means by "limit").
func balanceView(l *Limit, res LimitResult) *Limit {
	v := *l
	v.Limit = res.Used + res.Remaining
	return &v
}
