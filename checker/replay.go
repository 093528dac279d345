package checker

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unsafe"

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
}

// NewReplay returns a Replay of set holding at most about maxKeys buckets (0: 1M), evicting
// the expired ones first.
func NewReplay(set *rules.Set, maxKeys int) *Replay {
	return &Replay{set: set, local: bucket.NewLocal(maxKeys)}
}

// Planned is a check planned under a Replay's rules (Replay.Plan), to decide with
// Replay.Decide. Planning is half of a replay's work, and one subject's checks repeat: a
// caller may keep a Planned and decide it again at other instants when Fixed.
type Planned struct {
	pl        plan
	limits    []LimitOutcome
	tier      string
	exemption string
	// Fixed reports that the plan holds at any instant: the rules have no overrides and no
	// calendar windows (which depend on the clock), and the check takes no place in flight
	// (each taken by a holder of its own).
	Fixed bool
}

// Bytes estimates the memory p holds, for a cache of plans that bounds its size: its limits'
// outcomes and bucket limits with their keys dominate.
func (p *Planned) Bytes() int {
	n := 256
	for i := range p.pl.reqs {
		for j := range p.pl.reqs[i].Limits {
			n += 2*len(p.pl.reqs[i].Limits[j].Key) + int(unsafe.Sizeof(bucket.Limit{})) + int(unsafe.Sizeof(LimitOutcome{}))
		}
	}
	return n
}

// Check decides q at at and, when charge is set and the check is allowed, charges its buckets
// (as a counted rule's are charged whatever they answer): Plan, then Decide.
func (r *Replay) Check(at time.Time, q *Query, charge bool) (*Outcome, error) {
	p, err := r.Plan(at, q, charge)
	if err != nil {
		return nil, err
	}
	out := new(Outcome)
	r.Decide(at, p, out)
	return out, nil
}

// Plan plans q at at as Engine.Check plans a check: the rules matching its subjects, their
// limits and bucket keys. A check that was not charged where it was decided (a fail mode's
// answer, which Redis never saw) is planned with charge unset, so that the buckets stay those
// of Redis. The tier is q.Tier when the rules have it, unless the rules assign the check's
// user or API key a tier of their own. Its errors are those of Engine.Check for an invalid
// query (a FieldError).
func (r *Replay) Plan(at time.Time, q *Query, charge bool) (*Planned, error) {
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
	p := &Planned{pl: pl, limits: out.Limits, tier: out.Tier, exemption: out.Exemption,
		Fixed: !r.set.HasOverrides() && !r.set.HasCalendar()}
	for i := range pl.reqs {
		for j := range pl.reqs[i].Limits {
			p.Fixed = p.Fixed && !pl.reqs[i].Limits[j].Algorithm.Holds()
		}
	}
	return p, nil
}

// Decide decides p at at into out, reusing the storage of out.Limits.
func (r *Replay) Decide(at time.Time, p *Planned, out *Outcome) {
	*out = Outcome{Decider: -1, Now: at, Tier: p.tier, Exemption: p.exemption, Limits: append(out.Limits[:0], p.limits...)}
	// A check of several requests is decided as the store decides one (bucket.Local.CheckAll):
	// when an enforced request denies, the others' charges are refunded. The replay refunds at
	// the charge's instant; Redis refunds a round trip later, and a check of one of the buckets
	// in between saw the charge (backtest's refund_window reason).
	results := r.local.CheckAll(at, p.pl.reqs)
	for i, res := range results {
		for j, lr := range res.Limits {
			out.Limits[p.pl.at(i, j)].Result = lr
		}
	}
	out.summarize()
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
