package checker

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// plan is a check's bucket requests (one per subject's enforced limits, one per its shadow
// limits and one per candidate rule), in the form the store takes them, and where each
// request's results go in the outcome: first[i] is the index in Outcome.Limits of
// reqs[i].Limits[0], and of its other limits in order, unless idx is set (a plan whose leased
// limits were taken out, by decideLeased), which then holds the index of every limit.
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

// Check decides q and charges it: every matching rule of every subject, plus the global rules,
// in one atomic store call. The decision goes to the DecisionSink. A denial is an Outcome with
// Allowed false, not an error; errors are a FieldError (the request broke a rule), ErrNoRules,
// the caller's context ending, or a store failure that is not an outage.
func (e *Engine) Check(ctx context.Context, q *Query) (*Outcome, error) {
	return e.decide(ctx, q, false)
}

// Peek decides q as Check does but consumes nothing and publishes nothing
// (GetRemainingQuota).
func (e *Engine) Peek(ctx context.Context, q *Query) (*Outcome, error) {
	return e.decide(ctx, q, true)
}

func (e *Engine) decide(ctx context.Context, q *Query, peek bool) (*Outcome, error) {
	d := deadline{parent: ctx}
	defer d.release()
	var c started
	e.begin(ctx, &d, q, peek, &c)
	return e.end(&c)
}

// started is a check between begin and end: planned, and its store call sent unless it was
// decided without one (out then final, or err set).
type started struct {
	ctx   context.Context // the caller's, with the check's span
	span  trace.Span
	q     *Query
	peek  bool
	start time.Time
	out   *Outcome
	err   error
	// decided: out is the answer (or err the error) without a store call.
	decided bool
	pl      plan
	lz      leasedPart
	sentAt  int64
	call    storeCall
}

// begin plans q and sends its store call (within d), leaving c for end. Every begin needs its
// end, which ends the check's span.
func (e *Engine) begin(ctx context.Context, d *deadline, q *Query, peek bool, c *started) {
	c.start, c.peek, c.decided = time.Now(), peek, true
	c.ctx, c.span = e.tel.startSpan(ctx)
	set := e.rules.Load()
	if set == nil {
		c.err = ErrNoRules
		return
	}
	// Whatever the transport, rules match and decisions report the endpoint's normal form.
	q, err := normalQuery(q)
	if c.q, c.err = q, err; err != nil {
		return
	}
	out := &Outcome{Decider: -1}
	if c.err = resolveTier(set, q, out); c.err != nil {
		return
	}
	pl, err := planQuery(set, q, peek, out, e.clock)
	if c.err = err; err != nil {
		return
	}
	if !peek {
		if c.err = e.values.admit(e.clock, out.Limits); c.err != nil {
			return
		}
	}
	c.out = out
	if len(pl.reqs) == 0 {
		out.Allowed, out.Now = true, time.Now()
		return
	}
	// A retry with an idempotency key must replay its first decision, so it goes to the store.
	if e.olc != nil && !peek && q.IdempotencyKey == "" && !pl.candidates && e.fromCache(pl, out, q.Cost) {
		e.tel.cacheHit.Add(ctx, 1)
		out.summarize()
		return
	}
	// Leased limits are decided from this process's slices; the rest goes to the store.
	// A reservation's charge goes to Redis, where its settle finds it.
	if e.leases != nil && !peek && q.IdempotencyKey == "" && q.Reserve == 0 {
		if pl, c.lz = e.decideLeased(ctx, pl, out, q.Cost); c.lz.decided > 0 {
			e.tel.leased.Add(ctx, 1)
		}
		if c.lz.denied || len(pl.reqs) == 0 {
			e.leasedOnly(&c.lz, out)
			return
		}
	}
	if e.olc != nil {
		c.sentAt = e.olc.now()
	}
	c.pl, c.decided = pl, false
	c.call = e.store.send(c.ctx, d.of(e.store), pl.reqs, func(i, j int) rules.FailMode {
		return out.Limits[pl.at(i, j)].Rule.FailMode
	})
}

// end waits for c's store call and makes the decision (publishing it unless c is a peek).
func (e *Engine) end(c *started) (*Outcome, error) {
	if c.span != nil {
		defer c.span.End()
	}
	out, err := e.conclude(c)
	if err != nil {
		return nil, err
	}
	return e.record(c.ctx, c.q, out, c.peek, c.start), nil
}

// conclude is end's decision, before it is recorded.
func (e *Engine) conclude(c *started) (*Outcome, error) {
	if c.decided {
		return c.out, c.err
	}
	ctx, q, out, pl, lz, peek := c.ctx, c.q, c.out, &c.pl, &c.lz, c.peek
	results, degraded, err := e.store.wait(&c.call)
	if err != nil {
		e.leases.giveBackAll(lz)
	}
	if errors.Is(err, ErrIdempotencyConflict) {
		return nil, idempotencyConflict()
	}
	if err != nil {
		return nil, err
	}
	if !degraded && e.olc != nil && !peek {
		e.cacheDenials(*pl, out, results, q.Cost, c.sentAt)
	}
	var places []holdPlace
	var holder string
	for i, res := range results {
		for j, lr := range res.Limits {
			l := &out.Limits[pl.at(i, j)]
			l.Result, l.Degraded = LimitResult(lr), degraded
			if lim := &pl.reqs[i].Limits[j]; lim.Algorithm.Holds() && !peek && !degraded && !res.Refunded && !res.Replayed && lr.Allowed {
				places, holder = append(places, holdPlace{key: lim.Key, ttl: lim.Window}), lim.Holder
			}
		}
		out.Replayed = out.Replayed || res.Replayed
		out.Now = res.Now
		if !pl.reqs[i].Shadow && !pl.reqs[i].Peek && !res.Allowed {
			// The store denied: the units taken from slices go back to them.
			e.leases.giveBackAll(lz)
		}
	}
	out.summarize()
	if out.Allowed && len(places) > 0 {
		// Without an id the places free themselves at their expiry.
		if id, err := e.ids.sign(ctx, idKindLease, holdID(holder, places)); err != nil {
			e.log.Warn("concurrency lease not signed: its places free themselves at their expiry", "err", err)
		} else {
			out.Hold = &Hold{ID: id, ExpiresAt: out.Now.Add(minTTL(places))}
		}
	}
	if out.Allowed && q.Reserve > 0 && !peek && !degraded {
		// The check is decided and charged: a reservation that cannot be recorded leaves the
		// answer allowed with none (as a fail mode's admission has none), its estimate
		// standing, and the decision recorded like any other.
		if err := e.reserve(ctx, q, *pl, results, out); err != nil {
			e.log.Warn("reservation not recorded: its estimate stands", "err", err)
		}
	}
	return out, nil
}

// record gives a consuming check its decision id, counts it and hands its event to the sink:
// a durable sink holds the check until the event survives a crash, so that no answer leaves
// whose decision a kill -9 could lose. Peeks are not decisions: they consume nothing.
func (e *Engine) record(ctx context.Context, q *Query, out *Outcome, peek bool, start time.Time) *Outcome {
	if peek {
		return out
	}
	e.account(ctx, out, start)
	switch {
	case e.durable != nil:
		e.durable.PublishDurable(ctx, e.instanceID, q, out)
	case e.sink != nil:
		e.sink.Publish(e.instanceID, q, out)
	}
	return out
}

// account counts a consuming check's decision and gives it its id.
func (e *Engine) account(ctx context.Context, out *Outcome, start time.Time) {
	e.tel.record(ctx, out, start)
	e.counts.add(out)
	out.ID = e.nextDecisionID()
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
			return fieldErrorf("tier", "%q is not a configured tier", q.Tier)
		}
		out.Tier = q.Tier
	default:
		out.Tier = set.SubjectTier(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey))
	}
	return nil
}

// planQuery turns the matching rules into bucket requests: per subject one request for its
// enforced limits and one for its shadow limits, so that a shadow denial never blocks a charge.
func planQuery(set *rules.Set, q *Query, peek bool, out *Outcome, clock func() time.Time) (plan, error) {
	var pl plan
	// Overrides expire by the clock, and calendar periods are found around it: read it once
	// per check, and only when there are any.
	var now time.Time
	if set.HasOverrides() || set.HasCalendar() {
		now = clock()
	}
	var holder string // the holder of the places this check takes in flight, drawn when it takes one
	ex := exemption(set, q)
	add := func(sub Subject, tag string, rs []*rules.Rule, shadow bool, custom map[string]int64) error {
		var req bucket.Request
		first := len(out.Limits)
		for _, r := range rs {
			if r.Shadow != shadow {
				continue
			}
			if ex != nil && ex.Exempts(r.ID) {
				out.Exemption = ex.ID
				continue
			}
			lim := set.Effective(r, limitKey(tag, r), sub.Dimension, sub.ID, out.Tier, custom[r.ID], now)
			if lim.Algorithm.Holds() {
				// A place in flight, one per check whatever its cost.
				if holder == "" {
					holder = newHolder()
				}
				lim.Holder = holder
			} else if q.Cost > lim.Capacity() && !r.CountDenied && lim.Limit > 0 {
				// (A counted or zero limit denies such a cost: Envoy's semantics, and a ban's.)
				name := "cost"
				if q.Reserve > 0 {
					name = "estimate" // a reservation's cost
				}
				return fieldErrorf(name, "%d is more than rule %q can ever allow at once (%d)", q.Cost, r.ID, lim.Capacity())
			}
			req.Limits = append(req.Limits, lim)
			req.Count = req.Count || r.CountDenied
			out.Limits = append(out.Limits, LimitOutcome{Rule: r, Subject: sub, Limit: effectiveLimit(&lim), thresholds: set.Thresholds(r.ID)})
		}
		if len(req.Limits) == 0 {
			return nil
		}
		req.Cost, req.Peek, req.Shadow = q.Cost, peek, shadow
		pl.reqs = append(pl.reqs, req)
		pl.first = append(pl.first, first)
		return nil
	}
	// addCandidates plans the candidates of rs (rules.Rule.Candidates), each a request of its
	// own standing in for its live limit (bucket.Request.Replaces), so that its charge follows
	// its own answer and the other limits', as if it had replaced the live rule, and never
	// another candidate's. A candidate never refuses a check: a cost above its capacity is
	// its denial.
	addCandidates := func(sub Subject, tag string, rs []*rules.Rule, custom map[string]int64) {
		for _, r := range rs {
			if len(r.Candidates) == 0 || ex != nil && ex.Exempts(r.ID) {
				continue
			}
			var replaces string
			if !r.Shadow {
				replaces = limitKey(tag, r) // a shadow live rule denies nothing
			}
			for _, c := range r.Candidates {
				if ex != nil && ex.Exempts(c.ID) {
					out.Exemption = ex.ID
					continue
				}
				lim := set.Effective(c, limitKey(tag, c), sub.Dimension, sub.ID, out.Tier, custom[c.ID], now)
				pl.reqs = append(pl.reqs, bucket.Request{Limits: []bucket.Limit{lim}, Cost: q.Cost, Peek: peek, Shadow: true, Replaces: replaces})
				pl.first = append(pl.first, len(out.Limits))
				pl.candidates = true
				out.Limits = append(out.Limits, LimitOutcome{Rule: c, Subject: sub, Limit: effectiveLimit(&lim), thresholds: set.Thresholds(c.ID)})
			}
		}
	}
	// addBoth plans a subject's enforced and shadow limits under rs.
	addBoth := func(sub Subject, rs []*rules.Rule) error {
		var custom map[string]int64
		if sub.Dimension == rules.DimensionUser {
			u, _ := set.User(sub.ID)
			custom = u.Limits
		}
		tag := subjectTag(sub.Dimension, sub.ID)
		if err := add(sub, tag, rs, false, custom); err != nil {
			return err
		}
		if err := add(sub, tag, rs, true, custom); err != nil {
			return err
		}
		addCandidates(sub, tag, rs, custom)
		return nil
	}
	// addSubject plans every limit of sub's matching rules.
	addSubject := func(sub Subject) error {
		if sub.Dimension == rules.DimensionDescriptor {
			return descriptorMatches(set, out.Tier, q.Endpoint, sub, q.WholeDescriptor, func(r *rules.Rule, sub Subject) error {
				return addBoth(sub, []*rules.Rule{r})
			})
		}
		rs := set.Match(sub.Dimension, out.Tier, q.Endpoint)
		if len(rs) == 0 {
			return nil
		}
		if sub.Dimension == rules.DimensionIP {
			if addr, ok := subjectIP(sub.ID); ok {
				// Each network the rules count the address in is a subject of its own.
				return ipGroups(addr, rs, addBoth)
			}
		}
		return addBoth(sub, rs)
	}
	// The global subject is planned after the query's own, never appended to q.Subjects: that
	// would write into the spare capacity of the caller's slice, which two concurrent checks of
	// one Query share.
	for _, sub := range q.Subjects {
		if err := addSubject(sub); err != nil {
			return plan{}, err
		}
	}
	// The org's shared budget: the org of the check's user, else of its API key. Like the
	// global subject it is planned apart from the caller's slice, and it is never a subject a
	// caller names (checkSubject), so no caller charges an org it is no member of.
	if set.HasOrgRules() && !q.SkipOrg {
		if org := set.OrgOf(subjectOf(q, rules.DimensionUser), subjectOf(q, rules.DimensionAPIKey)); org != "" {
			if err := addSubject(Subject{Dimension: rules.DimensionOrg, ID: org}); err != nil {
				return plan{}, err
			}
		}
	}
	if !q.SkipGlobal {
		if err := addSubject(globalSubject); err != nil {
			return plan{}, err
		}
	}
	if q.IdempotencyKey != "" && !peek && len(pl.reqs) > 0 {
		a := pl.anchor(out)
		if pl.reqs[a].Count {
			// Every request counts its hits (Envoy's semantics): a retry is another hit, as
			// it is to the reference service, and there is no record to replay.
			return pl, nil
		}
		name, fp := idempotency(q)
		sub := out.Limits[pl.first[a]].Subject
		pl.reqs[a].IdempotencyKey = recordKey(subjectTag(sub.Dimension, sub.ID), name)
		pl.reqs[a].Fingerprint = fp
	}
	return pl, nil
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

// fromCache answers a check from the over-limit cache when one of its enforced buckets is known
// to deny it: the outcome then holds only the cached limits, as the only ones evaluated.
func (e *Engine) fromCache(pl plan, out *Outcome, cost int64) bool {
	now := e.olc.now()
	var hits []LimitOutcome
	for i := range pl.reqs {
		req := &pl.reqs[i]
		if req.Shadow {
			continue
		}
		for j := range req.Limits {
			if res, ok := e.olc.lookup(req.Limits[j].Key, cost, now); ok {
				lo := out.Limits[pl.at(i, j)]
				lo.Result = LimitResult(res)
				hits = append(hits, lo)
			}
		}
	}
	if hits == nil {
		return false
	}
	out.Limits, out.Now = hits, time.Now()
	return true
}

// cacheDenials remembers the enforced buckets that denied. Not those of leased rules (a check
// with an idempotency key charges them in Redis): their slices answer a spent window without
// Redis already, and a cached denial would keep the checks from the units this checker holds.
func (e *Engine) cacheDenials(pl plan, out *Outcome, results []bucket.Result, cost, sentAt int64) {
	for i := range pl.reqs {
		if pl.reqs[i].Shadow || results[i].Allowed || results[i].Replayed {
			continue
		}
		for j, lr := range results[i].Limits {
			if e.leases != nil && out.Limits[pl.at(i, j)].Rule.Lease > 0 {
				continue
			}
			if pl.reqs[i].Limits[j].Algorithm.Holds() {
				// A place in flight comes back when its holder releases it, at any time
				// before the retry the denial gives: caching the denial would deny checks
				// that Redis would admit.
				continue
			}
			if !lr.Allowed {
				e.olc.deny(pl.reqs[i].Limits[j].Key, cost, sentAt, lr)
			}
		}
	}
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
