package checker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// Replay decides checks again, at the instants they were decided, under a rule set of the
// caller's choosing: the planning of Engine.Check (matching, tiers' rules, custom limits,
// overrides, exemptions, bucket keys) with the in-process twins of the bucket scripts
// (bucket.Local), which share the scripts' formulas and rounding. Fed the decision audit in
// the order Redis decided it, it answers "what would these rules have done?"; fed the rules
// that decided, it reproduces the decisions of the exact algorithms.
//
// What it cannot know, it does not guess: a concurrency place is never released (the audit's
// release events are not replayed), and leases and the over-limit cache play no part. A
// Replay keeps its buckets in memory, up to the bound NewReplay was given. Its methods are
// safe for concurrent use, but checks must come in the order of their instants for their
// buckets to follow Redis's.
type Replay struct {
	set   *rules.Set
	local *bucket.Local
	// plans caches the plans of the queries seen, when the rules' plans do not depend on the
	// clock (no overrides, no calendar windows): one subject's checks repeat, and planning
	// is half of a replay's work.
	mu    sync.Mutex
	plans map[string]*replayPlan
	key   []byte // the key being looked up, under mu
}

// replayPlan is a query's plan and the limits of its outcome, which Check copies.
type replayPlan struct {
	pl        plan
	limits    []LimitOutcome
	tier      string
	exemption string
}

// maxReplayPlans bounds Replay's cache of plans: past it, the cache starts again.
const maxReplayPlans = 1 << 18

// NewReplay returns a Replay of set holding at most about maxKeys buckets (0: 1M), evicting
// the expired ones first.
func NewReplay(set *rules.Set, maxKeys int) *Replay {
	r := &Replay{set: set, local: bucket.NewLocal(maxKeys)}
	if !set.HasOverrides() && !set.HasCalendar() {
		r.plans = make(map[string]*replayPlan)
	}
	return r
}

// Rules returns the rule set the Replay decides by.
func (r *Replay) Rules() *rules.Set { return r.set }

// Check decides q at at and, when charge is set and the check is allowed, charges its buckets
// (as a counted rule's are charged whatever they answer). A check that was not charged where
// it was decided (a fail mode's answer, which Redis never saw) is replayed with charge unset,
// so that the buckets stay those of Redis. The tier is q.Tier when the rules have it, unless
// the rules assign the check's user or API key a tier of their own. Its errors are those of
// Engine.Check for an invalid query (a FieldError).
func (r *Replay) Check(at time.Time, q *Query, charge bool) (*Outcome, error) {
	rp, err := r.plan(at, q, charge)
	if err != nil {
		return nil, err
	}
	out := &Outcome{Decider: -1, Now: at, Tier: rp.tier, Exemption: rp.exemption, Limits: slices.Clone(rp.limits)}
	pl := &rp.pl
	// A check of several requests is decided as the store decides one (bucket.Local.CheckAll):
	// when an enforced request denies, the others' charges are refunded. The replay refunds at
	// the charge's instant; Redis refunds a round trip later, and a check of one of the buckets
	// in between saw the charge (backtest's refund_window reason).
	results := r.local.CheckAll(at, pl.reqs)
	for i, res := range results {
		for j, lr := range res.Limits {
			out.Limits[pl.at(i, j)].Result = LimitResult(lr)
		}
	}
	out.summarize()
	return out, nil
}

// plan returns q's plan, from the cache when the rules allow one.
func (r *Replay) plan(at time.Time, q *Query, charge bool) (*replayPlan, error) {
	if r.plans != nil {
		r.mu.Lock()
		r.key = planKey(r.key[:0], q, charge)
		rp := r.plans[string(r.key)] // no string made for a lookup
		r.mu.Unlock()
		if rp != nil {
			return rp, nil
		}
	}
	q, err := normalQuery(q)
	if err != nil {
		return nil, err
	}
	out := &Outcome{Decider: -1, Now: at}
	out.Tier = r.tier(q)
	pl, err := planQuery(r.set, q, !charge, out, func() time.Time { return at })
	if err != nil {
		return nil, err
	}
	rp := &replayPlan{pl: pl, limits: out.Limits, tier: out.Tier, exemption: out.Exemption}
	if r.plans == nil {
		return rp, nil
	}
	for i := range pl.reqs {
		for j := range pl.reqs[i].Limits {
			if pl.reqs[i].Limits[j].Algorithm.Holds() {
				return rp, nil // a place in flight is taken by a holder of its own
			}
		}
	}
	r.mu.Lock()
	if len(r.plans) >= maxReplayPlans {
		clear(r.plans)
	}
	r.plans[string(planKey(nil, q, charge))] = rp
	r.mu.Unlock()
	return rp, nil
}

// planKey appends to b what a query's plan depends on.
func planKey(b []byte, q *Query, charge bool) []byte {
	b = append(b, q.Tier...)
	b = append(b, 0)
	b = append(b, q.Endpoint...)
	b = append(b, 0)
	b = strconv.AppendInt(b, q.Cost, 10)
	if charge {
		b = append(b, 'c')
	}
	for _, s := range q.Subjects {
		b = append(b, 0, byte(s.Dimension))
		b = append(b, s.ID...)
	}
	return b
}

// tier is the tier a replayed check is decided under (Check).
func (r *Replay) tier(q *Query) string {
	user, key := subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey)
	if t := r.set.SubjectTier(user, key); t != r.set.DefaultTier() || q.Tier == "" || !r.set.HasTier(q.Tier) {
		return t
	}
	return q.Tier
}

// ParseDescriptorSubject returns the descriptor subject whose ID is id (DescriptorSubject's
// inverse), as the decision audit records it.
func ParseDescriptorSubject(id string) (Subject, error) {
	if id == "" {
		return Subject{}, fmt.Errorf("descriptor %q: no entries", id)
	}
	parts := strings.Split(id, ",")
	entries := make([]rules.Entry, len(parts))
	for i, p := range parts {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return Subject{}, fmt.Errorf("descriptor %q: entry %d has no '='", id, i)
		}
		var err error
		if entries[i].Key, err = unescapeEntry(k); err != nil {
			return Subject{}, fmt.Errorf("descriptor %q: entry %d: %w", id, i, err)
		}
		if entries[i].Value, err = unescapeEntry(v); err != nil {
			return Subject{}, fmt.Errorf("descriptor %q: entry %d: %w", id, i, err)
		}
	}
	sub := DescriptorSubject(entries)
	if sub.ID != id {
		return Subject{}, fmt.Errorf("descriptor %q is not written out as quotaflow writes one (%q)", id, sub.ID)
	}
	return sub, nil
}

// unescapeEntry undoes escapeEntry.
func unescapeEntry(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 > len(s) {
			return "", fmt.Errorf("%q: '%%' not followed by two hex digits", s)
		}
		n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("%q: '%%' not followed by two hex digits", s)
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), nil
}
