package checker

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

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
	lz      allottedPart
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
	// Allotted limits are decided from this process's allotments; the rest goes to the store.
	// A reservation's charge goes to Redis, where its settle finds it.
	if e.allotments != nil && !peek && q.IdempotencyKey == "" && q.Reserve == 0 {
		if pl, c.lz = e.decideAllotted(ctx, pl, out, q.Cost); c.lz.decided > 0 {
			e.tel.allotted.Add(ctx, 1)
		}
		if c.lz.denied || len(pl.reqs) == 0 {
			e.allottedOnly(&c.lz, out)
			return
		}
	}
	if e.olc != nil {
		c.sentAt = e.olc.now()
	}
	if e.journal != nil && !peek {
		e.journalBalances(out)
	}
	c.pl, c.decided = pl, false
	c.call = e.guard.send(c.ctx, d.of(e.guard), pl.reqs, func(i, j int) rules.FailMode {
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
	results, degraded, err := e.guard.wait(&c.call)
	if err != nil {
		e.allotments.giveBackAll(lz)
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
			l.Result, l.Degraded = lr, degraded
			if l.Limit.Algorithm == algorithm.Balance {
				l.Limit = balanceView(l.Limit, lr)
			}
			if lim := &pl.reqs[i].Limits[j]; lim.Algorithm.Holds() && !peek && !degraded && !res.Refunded && !res.Replayed && lr.Allowed {
				places, holder = append(places, holdPlace{key: lim.Key, ttl: lim.Window}), lim.Holder
			}
		}
		out.Replayed = out.Replayed || res.Replayed
		out.Now = res.Now
		if !pl.reqs[i].Shadow && !pl.reqs[i].Peek && !res.Allowed {
			// The store denied: the units taken from slices go back to them.
			e.allotments.giveBackAll(lz)
		}
	}
	out.summarize()
	if out.Allowed && len(places) > 0 {
		// Without an id the places free themselves at their expiry.
		if id, err := e.ids.sign(ctx, idKindLease, leaseID(holder, places)); err != nil {
			e.log.Warn("concurrency lease not signed: its places free themselves at their expiry", "err", err)
		} else {
			out.Lease = &Lease{ID: id, ExpiresAt: out.Now.Add(minTTL(places))}
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
// whose decision a kill -9 could lose; the balance journal's entries of a durable decision are
// dropped. Peeks are not decisions: they consume nothing.
func (e *Engine) record(ctx context.Context, q *Query, out *Outcome, peek bool, start time.Time) *Outcome {
	if peek {
		return out
	}
	e.account(ctx, out, start)
	if e.publish(ctx, q, out) && e.journal != nil {
		e.journal.durable(out)
	}
	return out
}

// publish hands a decision to the sink and reports whether it is durable (a sink without a
// spool hands it on at once: as durable as it makes decisions).
func (e *Engine) publish(ctx context.Context, q *Query, out *Outcome) bool {
	switch {
	case e.durable != nil:
		return e.durable.PublishDurable(ctx, e.instanceID, q, out)
	case e.sink != nil:
		e.sink.Publish(e.instanceID, q, out)
		return true
	}
	return false
}

// account counts a consuming check's decision and gives it its id, unless its journaled
// balances needed it before the store call (journalBalances).
func (e *Engine) account(ctx context.Context, out *Outcome, start time.Time) {
	e.tel.record(ctx, out, start)
	e.counts.add(out)
	if out.ID == "" {
		out.ID = e.nextDecisionID()
	}
}

// journalBalances gives a check that burns a balance its decision id now, before its store
// call, and has the call journal each balance's burn under it (journal.go).
func (e *Engine) journalBalances(out *Outcome) {
	for i := range out.Limits {
		l := &out.Limits[i]
		if l.Limit == nil || l.Limit.Algorithm != algorithm.Balance {
			continue
		}
		if out.ID == "" {
			out.ID = e.nextDecisionID()
		}
		l.Limit.Journal = journalArg(out.ID, l.Subject)
	}
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
				lo.Result = res
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

// cacheDenials remembers the enforced buckets that denied. Not those of allotted rules (a check
// with an idempotency key charges them in Redis): their slices answer a spent window without
// Redis already, and a cached denial would keep the checks from the units this checker holds.
func (e *Engine) cacheDenials(pl plan, out *Outcome, results []bucket.Result, cost, sentAt int64) {
	for i := range pl.reqs {
		if pl.reqs[i].Shadow || results[i].Allowed || results[i].Replayed {
			continue
		}
		for j, lr := range results[i].Limits {
			if e.allotments != nil && out.Limits[pl.at(i, j)].Rule.Allotment > 0 {
				continue
			}
			if a := pl.reqs[i].Limits[j].Algorithm; a.Holds() || a == algorithm.Balance {
				// A place in flight comes back when its holder releases it, and a balance
				// when a grant is made, at any time before the retry the denial gives:
				// caching the denial would deny checks that Redis would admit.
				continue
			}
			if !lr.Allowed {
				e.olc.deny(pl.reqs[i].Limits[j].Key, cost, sentAt, lr)
			}
		}
	}
}
