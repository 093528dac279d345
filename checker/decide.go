package checker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// WarningRatio is the share of a limit whose use turns a subject's state from normal to warning.
const WarningRatio = 0.8

// closedRetryAfter is what a fail_mode closed denial asks callers to wait: about one probe.
const closedRetryAfter = time.Second

// outcome is one decided check: what the RPC and HTTP layers render.
type outcome struct {
	allowed  bool
	replayed bool
	degraded bool
	now      time.Time
	tier     string
	limits   []limitOutcome
	decider  int // index in limits of the deciding limit; -1 when no rule matched
	id       string
	rendered []*quotaflowv1.LimitStatus // statuses(), rendered once
}

// limitOutcome is one rule applied to one subject.
type limitOutcome struct {
	rule     *rules.Rule
	subject  subject
	limit    bucket.Limit
	res      bucket.LimitResult
	degraded bool
}

// state is the limit's warning state as this decision sees it (seed 000's state machine).
func (l *limitOutcome) state() quotaflowv1.State {
	switch {
	case !l.res.Allowed:
		return quotaflowv1.State_STATE_THROTTLED
	case float64(l.res.Used) >= WarningRatio*float64(l.limit.Capacity()):
		return quotaflowv1.State_STATE_WARNING
	}
	return quotaflowv1.State_STATE_NORMAL
}

// plan is a check's bucket requests (one per subject's enforced limits and one per its shadow
// limits), in the form the store takes them, and where each request's results go in the
// outcome: first[i] is the index in outcome.limits of reqs[i].Limits[0].
type plan struct {
	reqs  []bucket.Request
	first []int
}

var globalSubject = subject{dim: rules.DimensionGlobal, id: "global"}

// decide evaluates q: every matching rule of every subject, plus the global rules. With peek it
// consumes nothing.
func (s *Server) decide(ctx context.Context, q *query, peek bool) (*outcome, error) {
	start := time.Now()
	ctx, span := s.tel.startSpan(ctx)
	if span != nil {
		defer span.End()
	}
	set := s.rules.Load()
	if set == nil {
		return nil, errNoRules
	}
	out := &outcome{decider: -1}
	if err := resolveTier(set, q, out); err != nil {
		return nil, err
	}
	pl, err := s.plan(set, q, peek, out)
	if err != nil {
		return nil, err
	}
	if len(pl.reqs) == 0 {
		out.allowed, out.now = true, time.Now()
		return s.record(ctx, q, out, peek, start), nil
	}
	// A retry with an idempotency key must replay its first decision, so it goes to Redis.
	if s.olc != nil && !peek && q.idemKey == "" && s.fromCache(pl, out, q.cost) {
		s.tel.cacheHit.Add(ctx, 1)
		out.summarize()
		return s.record(ctx, q, out, peek, start), nil
	}
	var results []bucket.Result
	if !s.redisDown.Load() {
		var sentAt int64
		if s.olc != nil {
			sentAt = s.olc.now()
		}
		rctx, cancel := context.WithTimeout(ctx, s.timeout)
		rstart := time.Now()
		results, err = s.store.Check(rctx, pl.reqs)
		s.tel.redis.Record(ctx, time.Since(rstart).Seconds())
		cancel()
		if err == nil && s.olc != nil && !peek {
			s.cacheDenials(pl, results, q.cost, sentAt)
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !redisUnavailable(err):
			return nil, fmt.Errorf("bucket check: %w", err)
		default:
			s.markRedisDown(err)
		}
	}
	if results == nil {
		s.fallback(pl, out)
	} else {
		for i, res := range results {
			for j, lr := range res.Limits {
				out.limits[pl.first[i]+j].res = lr
			}
			out.replayed = out.replayed || res.Replayed
			out.now = res.Now
		}
	}
	out.summarize()
	return s.record(ctx, q, out, peek, start), nil
}

// record gives a consuming check its decision id, counts it and hands its event to the sink.
// Peeks are not decisions: they consume nothing.
func (s *Server) record(ctx context.Context, q *query, out *outcome, peek bool, start time.Time) *outcome {
	if peek {
		return out
	}
	s.tel.record(ctx, out, start)
	out.id = s.nextDecisionID()
	if s.sink != nil {
		s.sink.Publish(out.decision(q, s.instanceID))
	}
	return out
}

func resolveTier(set *rules.Set, q *query, out *outcome) error {
	switch {
	case q.tier != "":
		if !set.HasTier(q.tier) {
			return fieldErr("tier", "%q is not a configured tier", q.tier)
		}
		out.tier = q.tier
	default:
		out.tier = set.DefaultTier()
		for _, sub := range q.subjects {
			if sub.dim == rules.DimensionUser {
				out.tier = set.TierOf(sub.id)
			}
		}
	}
	return nil
}

// plan turns the matching rules into bucket requests: per subject one request for its enforced
// limits and one for its shadow limits, so that a shadow denial never blocks a charge.
func (s *Server) plan(set *rules.Set, q *query, peek bool, out *outcome) (plan, error) {
	var pl plan
	// Overrides expire by the clock: read it once per check, and only when there are any.
	var now time.Time
	if set.HasOverrides() {
		now = time.Now()
	}
	add := func(sub subject, tag string, rs []*rules.Rule, shadow bool, custom map[string]int64) error {
		var req bucket.Request
		first := len(out.limits)
		for _, r := range rs {
			if r.Shadow != shadow {
				continue
			}
			lim := set.Effective(r, limitKey(tag, r), sub.dim, sub.id, out.tier, custom[r.ID], now)
			if q.cost > lim.Capacity() {
				return fieldErr("cost", "%d is more than rule %q can ever allow at once (%d)", q.cost, r.ID, lim.Capacity())
			}
			req.Limits = append(req.Limits, lim)
			out.limits = append(out.limits, limitOutcome{rule: r, subject: sub, limit: lim})
		}
		if len(req.Limits) == 0 {
			return nil
		}
		req.Cost, req.Peek, req.Shadow = q.cost, peek, shadow
		if q.idemKey != "" && !peek {
			suffix := q.idemKey
			if shadow {
				suffix += "\x00shadow"
			}
			req.IdempotencyKey = idempotencyKey(tag, suffix)
		}
		pl.reqs = append(pl.reqs, req)
		pl.first = append(pl.first, first)
		return nil
	}
	subjects := q.subjects
	if !q.skipGlobal {
		subjects = append(subjects, globalSubject)
	}
	for _, sub := range subjects {
		rs := set.Match(sub.dim, out.tier, q.endpoint)
		if len(rs) == 0 {
			continue
		}
		var custom map[string]int64
		if sub.dim == rules.DimensionUser {
			u, _ := set.User(sub.id)
			custom = u.Limits
		}
		tag := subjectTag(sub.dim, sub.id)
		if err := add(sub, tag, rs, false, custom); err != nil {
			return plan{}, err
		}
		if err := add(sub, tag, rs, true, custom); err != nil {
			return plan{}, err
		}
	}
	return pl, nil
}

// fromCache answers a check from the over-limit cache when one of its enforced buckets is known
// to deny it: the outcome then holds only the cached limits, as the only ones evaluated.
func (s *Server) fromCache(pl plan, out *outcome, cost int64) bool {
	now := s.olc.now()
	var hits []limitOutcome
	for i := range pl.reqs {
		req := &pl.reqs[i]
		if req.Shadow {
			continue
		}
		for j := range req.Limits {
			if res, ok := s.olc.lookup(req.Limits[j].Key, cost, now); ok {
				lo := out.limits[pl.first[i]+j]
				lo.res = res
				hits = append(hits, lo)
			}
		}
	}
	if hits == nil {
		return false
	}
	out.limits, out.now = hits, time.Now()
	return true
}

// cacheDenials remembers the enforced buckets that denied.
func (s *Server) cacheDenials(pl plan, results []bucket.Result, cost, sentAt int64) {
	for i := range pl.reqs {
		if pl.reqs[i].Shadow || results[i].Allowed || results[i].Replayed {
			continue
		}
		for j, lr := range results[i].Limits {
			if !lr.Allowed {
				s.olc.deny(pl.reqs[i].Limits[j].Key, cost, sentAt, lr)
			}
		}
	}
}

// fallback decides while Redis is unreachable, limit by limit, by each rule's fail mode: open
// allows, closed denies, local uses this process's own buckets with the same algorithm.
func (s *Server) fallback(pl plan, out *outcome) {
	now := time.Now()
	out.now, out.degraded = now, true
	for r := range pl.reqs {
		req := &pl.reqs[r]
		var local bucket.Request
		var idx []int
		for j, lim := range req.Limits {
			i := pl.first[r] + j
			lo := &out.limits[i]
			lo.degraded = true
			switch lo.rule.FailMode {
			case rules.FailClosed:
				lo.res = bucket.LimitResult{RetryAfter: closedRetryAfter, ResetAt: now.Add(closedRetryAfter)}
			case rules.FailLocal:
				local.Limits = append(local.Limits, lim)
				idx = append(idx, i)
			default:
				lo.res = bucket.LimitResult{Allowed: true, Remaining: lim.Capacity(), ResetAt: now}
			}
		}
		if len(idx) == 0 {
			continue
		}
		local.Cost, local.Peek = req.Cost, req.Peek
		res := s.local.Check(now, local)
		for j, lr := range res.Limits {
			out.limits[idx[j]].res = lr
		}
	}
}

// summarize derives the overall answer: allowed when no enforced limit denied; the deciding
// limit is the denying one with the longest wait, or when allowed the one with the largest
// share of its capacity used.
func (o *outcome) summarize() {
	o.allowed = true
	bestShare := -1.0
	for i := range o.limits {
		l := &o.limits[i]
		if l.degraded {
			o.degraded = true
		}
		if l.rule.Shadow {
			continue
		}
		if !l.res.Allowed {
			if o.allowed || l.res.RetryAfter > o.limits[o.decider].res.RetryAfter {
				o.decider = i
			}
			o.allowed = false
			continue
		}
		if !o.allowed {
			continue
		}
		share := float64(l.res.Used) / float64(l.limit.Capacity())
		if share > bestShare || (share == bestShare && l.res.Remaining < o.limits[o.decider].res.Remaining) {
			bestShare, o.decider = share, i
		}
	}
	if o.decider < 0 && len(o.limits) > 0 {
		o.decider = 0 // only shadow limits matched: report the first
	}
}

// redisUnavailable tells a Redis that cannot answer now (network, deadline, or a server that is
// loading, busy, read-only or out of memory), where the fail modes decide, from an error of the
// request or the script, which is a bug to report rather than a reason to degrade.
func redisUnavailable(err error) bool {
	if errors.Is(err, bucket.ErrInvalidRequest) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network, timeout, closed pool
	}
	for _, prefix := range []string{"LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOREPLICAS"} {
		if strings.HasPrefix(rerr.Error(), prefix) {
			return true
		}
	}
	return false
}

// isFieldError reports whether err is a request that broke a rule.
func isFieldError(err error) bool {
	var fe *FieldError
	return errors.As(err, &fe)
}
