package checker

import (
	"net/netip"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// plan is a check's bucket requests (one per subject's enforced limits, one per its shadow
// limits and one per candidate rule), in the form the store takes them, and where each
// request's results go in the outcome: first[i] is the index in Outcome.Limits of
// reqs[i].Limits[0], and of its other limits in order, unless idx is set (a plan whose allotted
// limits were taken out, by decideAllotted), which then holds the index of every limit.
type plan struct {
	reqs  []bucket.Request
	first []int
	idx   [][]int
	// candidates is set when a request is a candidate rule's: the check goes to the store
	// even when the over-limit cache knows its answer, so that the candidate is evaluated on
	// every check its live rule is, the denied ones too.
	candidates bool
}

// at is the index in Outcome.Limits of reqs[i].Limits[j].
func (pl *plan) at(i, j int) int {
	if pl.idx != nil {
		return pl.idx[i][j]
	}
	return pl.first[i] + j
}

// planner compiles one check into bucket requests: the rules that match each of its subjects,
// with their effective limits (bucketLimit), per subject one request for its enforced limits,
// one for its shadow limits (so that a shadow denial never blocks a charge) and one per
// candidate rule. It is the one place that knows both the rule model and the buckets; each of
// its methods is one step of planQuery.
type planner struct {
	set  *rules.Set
	q    *Query
	peek bool
	out  *Outcome
	// now is read once per check, and only when overrides, calendar rules or entitlements need
	// it: overrides expire by the clock, and calendar periods are found around it.
	now time.Time
	ex  *rules.Exemption // the exemption of the check's subjects, nil for none
	// holder is the holder of the places this check takes in flight, drawn when it takes one.
	holder string
	pl     plan
}

// planQuery plans q: its subjects', then its org's, then the global subject's limits, then the
// idempotency record. out receives a LimitOutcome per planned limit.
func planQuery(set *rules.Set, q *Query, peek bool, out *Outcome, clock func() time.Time) (plan, error) {
	p := planner{set: set, q: q, peek: peek, out: out, ex: exemption(set, q)}
	if set.HasOverrides() || set.HasCalendar() || set.HasEntitlements() {
		p.now = clock()
	}
	// The global subject is planned after the query's own, never appended to q.Subjects: that
	// would write into the spare capacity of the caller's slice, which two concurrent checks of
	// one Query share.
	for _, sub := range q.Subjects {
		if err := p.subject(sub); err != nil {
			return plan{}, err
		}
	}
	// The org's shared budget: the org of the check's user, else of its API key. Like the
	// global subject it is planned apart from the caller's slice, and it is never a subject a
	// caller names (checkSubject), so no caller charges an org it is no member of.
	if set.HasOrgRules() && !q.SkipOrg {
		if org := set.OrgOf(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey)); org != "" {
			if err := p.subject(Subject{Dimension: rules.DimensionOrg, ID: org}); err != nil {
				return plan{}, err
			}
		}
	}
	if !q.SkipGlobal {
		if err := p.subject(globalSubject); err != nil {
			return plan{}, err
		}
	}
	if set.HasEntitlements() {
		if err := p.entitlements(); err != nil {
			return plan{}, err
		}
	}
	p.idempotencyRecord()
	return p.pl, nil
}

// subject plans every limit of sub's matching rules: a descriptor's rules as Envoy matches
// them, an address's rules per network it is counted in.
func (p *planner) subject(sub Subject) error {
	if sub.Dimension == rules.DimensionDescriptor {
		return descriptorMatches(p.set, p.out.Tier, p.q.Endpoint, sub, p.q.WholeDescriptor, func(r *rules.Rule, sub Subject) error {
			return p.rules(sub, []*rules.Rule{r})
		})
	}
	rs := p.set.Match(sub.Dimension, p.out.Tier, p.q.Endpoint)
	if len(rs) == 0 {
		return nil
	}
	if sub.Dimension == rules.DimensionIP {
		if addr, ok := subjectIP(sub.ID); ok {
			// Each network the rules count the address in is a subject of its own.
			return ipGroups(addr, rs, p.rules)
		}
	}
	return p.rules(sub, rs)
}

// rules plans a subject's enforced and shadow limits under rs, and their candidates.
func (p *planner) rules(sub Subject, rs []*rules.Rule) error {
	var custom map[string]int64
	if sub.Dimension == rules.DimensionUser {
		u, _ := p.set.User(sub.ID)
		custom = u.Limits
	}
	tag := subjectTag(sub.Dimension, sub.ID)
	if err := p.request(sub, tag, rs, false, custom); err != nil {
		return err
	}
	if err := p.request(sub, tag, rs, true, custom); err != nil {
		return err
	}
	p.candidates(sub, tag, rs, custom)
	return nil
}

// request plans one request: the limits of rs that are shadow (or not), less the exempt ones.
// A cost above a limit's capacity is the caller's error, unless the rule counts it as a hit.
func (p *planner) request(sub Subject, tag string, rs []*rules.Rule, shadow bool, custom map[string]int64) error {
	var req bucket.Request
	first := len(p.out.Limits)
	for _, r := range rs {
		if r.Shadow != shadow {
			continue
		}
		if p.ex != nil && p.ex.Exempts(r.ID) {
			p.out.Exemption = p.ex.ID
			continue
		}
		lim := bucketLimit(p.set, r, limitKey(tag, r), sub, p.out.Tier, custom[r.ID], p.now)
		if err := p.fits(r, &lim); err != nil {
			return err
		}
		req.Limits = append(req.Limits, lim)
		req.Count = req.Count || r.CountDenied
		p.out.Limits = append(p.out.Limits, LimitOutcome{Rule: r, Subject: sub, thresholds: p.set.Thresholds(r.ID)})
	}
	if len(req.Limits) == 0 {
		return nil
	}
	req.Cost, req.Peek, req.Shadow = p.q.Cost, p.peek, shadow
	p.pl.reqs = append(p.pl.reqs, req)
	p.pl.first = append(p.pl.first, first)
	// Each outcome points at its limit in the request, complete now: no copy of a limit per
	// check, and the answer reports exactly what the store was sent.
	for k := range req.Limits {
		p.out.Limits[first+k].Limit = &req.Limits[k]
	}
	return nil
}

// fits checks that the check's cost can ever be allowed by lim, and gives a limit of places in
// flight the check's holder (one place per check, whatever its cost).
func (p *planner) fits(r *rules.Rule, lim *bucket.Limit) error {
	switch {
	case lim.Algorithm.Holds():
		if p.holder == "" {
			p.holder = newHolder()
		}
		lim.Holder = p.holder
	case p.q.Cost > lim.Capacity() && !r.CountDenied && lim.Limit > 0:
		// (A counted or zero limit denies such a cost: Envoy's semantics, and a ban's.)
		name := "cost"
		if p.q.Reserve > 0 {
			name = "estimate" // a reservation's cost
		}
		return field.Errorf(name, "%d is more than rule %q can ever allow at once (%d)", p.q.Cost, r.ID, lim.Capacity())
	}
	return nil
}

// candidates plans the candidates of rs (rules.Rule.Candidates), each a request of its own
// standing in for its live limit (bucket.Request.Replaces), so that its charge follows its own
// answer and the other limits', as if it had replaced the live rule, and never another
// candidate's. A candidate never refuses a check: a cost above its capacity is its denial.
func (p *planner) candidates(sub Subject, tag string, rs []*rules.Rule, custom map[string]int64) {
	for _, r := range rs {
		if len(r.Candidates) == 0 || p.ex != nil && p.ex.Exempts(r.ID) {
			continue
		}
		var replaces string
		if !r.Shadow {
			replaces = limitKey(tag, r) // a shadow live rule denies nothing
		}
		for _, c := range r.Candidates {
			if p.ex != nil && p.ex.Exempts(c.ID) {
				p.out.Exemption = p.ex.ID
				continue
			}
			lim := bucketLimit(p.set, c, limitKey(tag, c), sub, p.out.Tier, custom[c.ID], p.now)
			lims := []bucket.Limit{lim}
			p.pl.reqs = append(p.pl.reqs, bucket.Request{Limits: lims, Cost: p.q.Cost, Peek: p.peek, Shadow: true, Replaces: replaces})
			p.pl.first = append(p.pl.first, len(p.out.Limits))
			p.pl.candidates = true
			p.out.Limits = append(p.out.Limits, LimitOutcome{Rule: c, Subject: sub, Limit: &lims[0], thresholds: p.set.Thresholds(c.ID)})
		}
	}
}

// idempotencyRecord gives the check's idempotency record (Query.IdempotencyKey) to the request
// that carries it (anchor), unless its requests count every hit.
func (p *planner) idempotencyRecord() {
	pl, q := &p.pl, p.q
	if q.IdempotencyKey == "" || p.peek || len(pl.reqs) == 0 {
		return
	}
	a := pl.anchor(p.out)
	if pl.reqs[a].Count {
		// Every request counts its hits (Envoy's semantics): a retry is another hit, as it is
		// to the reference service, and there is no record to replay.
		return
	}
	name, fp := idempotency(q)
	sub := p.out.Limits[pl.first[a]].Subject
	pl.reqs[a].IdempotencyKey = recordKey(subjectTag(sub.Dimension, sub.ID), name)
	pl.reqs[a].Fingerprint = fp
}

// bucketLimit compiles rule r into the limit of bucket key for sub (of tier, with custom its
// user's own limit, 0 for none) at now: the effective limit and burst (rules.Set.Effective),
// and for a calendar rule the calendar window over the subject's periods around now.
func bucketLimit(set *rules.Set, r *rules.Rule, key string, sub Subject, tier string, custom int64, now time.Time) bucket.Limit {
	limit, burst := set.Effective(r, sub.Dimension, sub.ID, tier, custom, now)
	l := bucket.Limit{Key: key, Algorithm: r.Algorithm, Limit: limit, Window: r.Window, Burst: burst,
		MaxDelay: r.MaxDelay, OverageCap: r.MaxOverage, Pooled: !r.Dimension.Own()}
	if r.Calendar.Unit.Valid() {
		l.Algorithm = algorithm.CalendarWindow
		l.Periods = set.Period(r, sub.Dimension, sub.ID, tier).Around(now)
	}
	return l
}

// anchor picks the request that carries the check's one idempotency record, so the record
// lives in that request's slot (bucket.Store.Check): the first by dimension (user, ip, apikey,
// then global, whose namespace every check shares; each dimension appears once, so the
// client's order of subjects does not matter), a subject's enforced request before its shadow
// one. It depends on the rules only through which subjects have limits: a rule change that
// moves it between a check and its retry costs the retry a second charge, never a replay it
// should not have.
func (pl *plan) anchor(out *Outcome) int {
	best := 0
	for i := 1; i < len(pl.reqs); i++ {
		a, b := out.Limits[pl.first[i]].Subject.Dimension, out.Limits[pl.first[best]].Subject.Dimension
		switch ci, cb := pl.reqs[i].Count, pl.reqs[best].Count; {
		case ci != cb:
			// A counted request carries no record: any other goes first.
			if !ci {
				best = i
			}
		case a < b || a == b && !pl.reqs[i].Shadow && pl.reqs[best].Shadow:
			best = i
		}
	}
	return best
}

// exemption is the exemption of q's subjects, nil for none (rules.Set.Exemption).
func exemption(set *rules.Set, q *Query) *rules.Exemption {
	if !set.HasExemptions() {
		return nil
	}
	var ip netip.Addr
	var entries []rules.Entry
	for _, sub := range q.Subjects {
		switch sub.Dimension {
		case rules.DimensionIP:
			ip, _ = subjectIP(sub.ID)
		case rules.DimensionDescriptor:
			entries = sub.Entries
		}
	}
	return set.Exemption(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey), ip, entries)
}

// subjectOf is the identifier of q's subject of dimension d, empty when it has none.
func subjectOf(q *Query, d rules.Dimension) string {
	for _, sub := range q.Subjects {
		if sub.Dimension == d {
			return sub.ID
		}
	}
	return ""
}

// resolveTier picks the check's tier: the one the query names (transports let only callers
// allowed to assert tiers name one), else the subjects' configured tier.
func resolveTier(set *rules.Set, q *Query, out *Outcome) error {
	switch {
	case q.Tier != "":
		if !set.HasTier(q.Tier) {
			return field.Errorf("tier", "%q is not a configured tier", q.Tier)
		}
		out.Tier = q.Tier
	default:
		out.Tier = set.SubjectTier(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey))
	}
	return nil
}

// descriptorMatches calls add with each rule a check's descriptor sub counts against, and the
// subject whose bucket it is counted in, until add fails. The whole descriptor reaches one rule
// as Envoy's reference service matches it, entry by entry and only where the descriptor ends
// ("dimension: descriptor" rules); and each entry of a descriptor of several reaches the rules
// written for its custom dimension alone ("dimension: tenant"), so that a custom dimension
// counts against its rules whatever else the check names: adding an entry (a header a gateway
// forgot to strip) cannot take a check out of its tenant's limit. A rule marked unlimited that
// the whole descriptor reaches takes the check out of all of them; one an entry reaches, out
// of that entry's. With whole (Query.WholeDescriptor: an imported Envoy domain), only the
// whole descriptor is matched, as the reference does.
func descriptorMatches(set *rules.Set, tier, endpoint string, sub Subject, whole bool, add func(*rules.Rule, Subject) error) error {
	r, bucket := set.MatchDescriptor(tier, endpoint, sub.Entries)
	if r != nil && r.Unlimited {
		return nil
	}
	if r != nil {
		if err := add(r, descriptorBucket(sub, bucket)); err != nil {
			return err
		}
	}
	if whole || len(sub.Entries) < 2 {
		return nil
	}
	for i := range sub.Entries {
		one := sub.Entries[i : i+1 : i+1]
		r, bucket := set.MatchDescriptor(tier, endpoint, one)
		if r == nil || r.Unlimited {
			continue
		}
		if err := add(r, descriptorBucket(DescriptorSubject(one), bucket)); err != nil {
			return err
		}
	}
	return nil
}

// descriptorBucket is the subject a descriptor's bucket is counted under: sub, or, when the
// match went through a shared wildcard (Rule.Shared), the descriptor with the wildcard's
// pattern for the values it matched.
func descriptorBucket(sub Subject, bucket []rules.Entry) Subject {
	if &bucket[0] != &sub.Entries[0] {
		return DescriptorSubject(bucket)
	}
	return sub
}
