package checker

import (
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

// newValues bounds the distinct values each descriptor rule counts in a window on this checker
// (rules.Rule.MaxValues): a caller naming a new tenant in every request would otherwise make a
// bucket each, without end (100k in 4 s). The bound is per checker, so a fleet of N admits up
// to N times it; the window is the rule's (nominal for a calendar one), starting when the
// rule's first value of it is seen. Memory: a window holds at most MaxValues identifiers.
type newValues struct {
	mu    sync.Mutex
	rules map[string]*valueWindow // by rule id
}

// valueWindow is one rule's values of its current window.
type valueWindow struct {
	end  time.Time
	seen map[string]struct{}
}

// admit records the descriptor values limits name at clock's now, and refuses the check with
// a FieldError naming custom_dimension when one is new past its rule's MaxValues, recording
// none of them. A check of no descriptor rule takes no lock: this runs for every check.
func (n *newValues) admit(clock func() time.Time, limits []LimitOutcome) error {
	if !bounded(limits) {
		return nil
	}
	now := clock()
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range limits {
		r, sub := limits[i].Rule, limits[i].Subject
		if r == nil || r.Dimension != rules.DimensionDescriptor || r.MaxValues <= 0 {
			continue
		}
		w := n.window(r, now)
		if _, ok := w.seen[sub.ID]; ok {
			continue
		}
		if int64(len(w.seen)) >= r.MaxValues {
			return field.Errorf("custom_dimension", "rule %q counts %d distinct values in this window already on this checker (its max_values): a new one is refused until %s",
				r.ID, r.MaxValues, w.end.UTC().Format(time.RFC3339))
		}
	}
	for i := range limits {
		r := limits[i].Rule
		if r != nil && r.Dimension == rules.DimensionDescriptor && r.MaxValues > 0 {
			n.window(r, now).seen[limits[i].Subject.ID] = struct{}{}
		}
	}
	return nil
}

// bounded reports whether a limit is of a descriptor rule with MaxValues.
func bounded(limits []LimitOutcome) bool {
	for i := range limits {
		if r := limits[i].Rule; r != nil && r.Dimension == rules.DimensionDescriptor && r.MaxValues > 0 {
			return true
		}
	}
	return false
}

// window is r's current window at now, begun afresh when the last one ended.
func (n *newValues) window(r *rules.Rule, now time.Time) *valueWindow {
	if n.rules == nil {
		n.rules = map[string]*valueWindow{}
	}
	w := n.rules[r.ID]
	if w == nil || !now.Before(w.end) {
		w = &valueWindow{end: now.Add(r.Window), seen: map[string]struct{}{}}
		n.rules[r.ID] = w
	}
	return w
}
