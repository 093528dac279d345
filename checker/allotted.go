package checker

import (
	"context"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// allottedPart is what a check took from slices: given back when the check is denied.
type allottedPart struct {
	taken   []taken
	decided int  // limits decided from slices
	denied  bool // an enforced one denied
	// limits are the indexes in Outcome.Limits of the limits decided from slices.
	limits []int
}

// decideAllotted decides the allotted limits of pl from this process's allotments (allotments), writes
// their results into out, and returns the plan of what is left for the store, with each
// limit's index in out. A check stays all-or-nothing: the units it takes from slices go back to
// them when another limit denies it (giveBackAll). A limit whose slice could not be allotted
// (Redis unavailable) stays in the plan, decided by the store and its fail mode like any other
// (its charge counts in the same window counter as allotments). Checks with an idempotency key are
// not allotted: their record must be written in the same script call as their charges.
func (e *Engine) decideAllotted(ctx context.Context, pl plan, out *Outcome, cost int64) (plan, allottedPart) {
	var lz allottedPart
	allotted := false
	for i := range out.Limits {
		if out.Limits[i].Rule.Allotment > 0 {
			allotted = true
			break
		}
	}
	if !allotted {
		return pl, lz
	}
	var rest plan
	rest.idx = make([][]int, 0, len(pl.reqs))
	for i := range pl.reqs {
		req := &pl.reqs[i]
		var keep []bucket.Limit
		var keepIdx []int
		for j := range req.Limits {
			k := pl.at(i, j)
			r := out.Limits[k].Rule
			if r.Allotment > 0 && req.Limits[j].Algorithm == algorithm.FixedWindow {
				res, tk, ok := e.allotments.take(ctx, req.Limits[j], r.Allotment, cost)
				if ok {
					out.Limits[k].Result = res
					lz.decided++
					lz.limits = append(lz.limits, k)
					if tk.l != nil {
						lz.taken = append(lz.taken, tk)
					}
					if !res.Allowed && !req.Shadow {
						lz.denied = true
					}
					continue
				}
			}
			keep = append(keep, req.Limits[j])
			keepIdx = append(keepIdx, k)
		}
		if len(keep) == 0 {
			continue
		}
		r := *req
		r.Limits = keep
		rest.reqs = append(rest.reqs, r)
		rest.first = append(rest.first, keepIdx[0])
		rest.idx = append(rest.idx, keepIdx)
	}
	if lz.decided == 0 {
		return pl, lz
	}
	return rest, lz
}

// allottedOnly finishes a check decided from slices alone: every limit was allotted, or a allotted one
// denied it, in which case the store is not called and the outcome holds only the limits
// decided from slices, the only ones evaluated (as an over-limit cache hit holds only its own).
func (e *Engine) allottedOnly(lz *allottedPart, out *Outcome) {
	if lz.denied {
		e.allotments.giveBackAll(lz)
		limits := make([]LimitOutcome, 0, len(lz.limits))
		for _, k := range lz.limits {
			limits = append(limits, out.Limits[k])
		}
		out.Limits = limits
	}
	out.Now = time.Now()
	out.summarize()
}

// giveBackAll gives the units lz took back to their slices, once.
func (t *allotments) giveBackAll(lz *allottedPart) {
	if t == nil {
		return
	}
	for _, tk := range lz.taken {
		t.giveBack(tk)
	}
	lz.taken = nil
}
