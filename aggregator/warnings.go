package aggregator

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The warning states (docs/warnings.md), as stored and as events name them.
const (
	stNormal uint8 = iota
	stWarning
	stThrottled
)

var stateNames = [...]string{events.StateNormal, events.StateWarning, events.StateThrottled}

// Causes of a transition.
const (
	causeDecision = "decision"
	causeTimer    = "timer"
)

// wkey is what a warning state belongs to: one subject on one rule.
type wkey struct {
	dim  quotaflowv1.Dimension
	id   string
	rule string
}

// wstate is one tracked (subject, rule): a state that is not normal, or has a timer pending.
// Times are unix microseconds of event time (decision times and the instants derived from
// them), never the aggregator's clock, so that any aggregator replaying the same decisions
// from the same state computes the same transitions.
type wstate struct {
	State uint8  `json:"s"`
	Tier  string `json:"t"`
	// Changed is the instant of the last transition; Last the time of the last decision.
	Changed int64 `json:"c"`
	Last    int64 `json:"l"`
	// Until is when the throttled wait ends: the last denial's time plus its retry-after.
	Until int64 `json:"u,omitempty"`
	// Reset is when the limit is fully available again, as of the last decision.
	Reset int64 `json:"r,omitempty"`
	// Seq is the stream sequence of the last decision message applied.
	Seq uint64 `json:"q"`
	// The last decision's figures, reported by the transitions timers make.
	Limit     int64   `json:"n"`
	Remaining int64   `json:"m"`
	WindowMs  int64   `json:"w"`
	Usage     float64 `json:"g"`
	// The key, so that a stored state names its subject without decoding its KV key.
	Dim  quotaflowv1.Dimension `json:"d"`
	ID   string                `json:"i"`
	Rule string                `json:"k"`

	dirty bool
	cur   uint64 // the message being applied: its other decisions are not replays
}

func (st *wstate) key() wkey { return wkey{st.Dim, st.ID, st.Rule} }

// due returns the instant of the state's pending timer, 0 when it has none: the end of the
// throttled wait, or a warning's reset (the limit fully available again).
func (st *wstate) due() int64 {
	switch st.State {
	case stThrottled:
		return st.Until
	case stWarning:
		if st.Reset > 0 {
			return max(st.Reset, st.Changed)
		}
	}
	return 0
}

// transition is one state change, ready to publish.
type transition struct {
	ev       events.Transition
	from, to uint8
}

// machine is one partition's warning states. It is used by the partition's fetcher alone.
type machine struct {
	stream string // the decision stream, part of every transition id
	states map[wkey]*wstate
	// hw is the highest stream sequence applied: messages at or below it were applied before.
	hw      uint64
	hwDirty bool
	out     []transition
	// crossed are the entitlement events of the decisions applied, published with out
	// (aggregator/entitlements.go).
	crossed []events.EntitlementEvent
	th      func(rule string) rules.Thresholds
}

func newMachine(stream string) *machine {
	return &machine{stream: stream, states: map[wkey]*wstate{}, th: func(string) rules.Thresholds { return rules.DefaultThresholds }}
}

// thresholdsOf returns a lookup of the rule set's thresholds (defaults without one).
func thresholdsOf(set *rules.Set) func(string) rules.Thresholds {
	if set == nil {
		return func(string) rules.Thresholds { return rules.DefaultThresholds }
	}
	return set.Thresholds
}

// apply feeds the limits of one stream message's decisions to the states. A message at or below
// the high-water sequence was applied already (a redelivery) and changes nothing.
func (m *machine) apply(seq uint64, decisions []*quotaflowv1.Decision) {
	if seq <= m.hw {
		return
	}
	for _, d := range decisions {
		m.crossed = appendCrossings(m.crossed, d)
		if d.Replayed || d.Degraded || d.Kind == quotaflowv1.Kind_KIND_RECOVERED {
			// A replay charged nothing; a degraded decision did not see Redis; a recovered one
			// knows its balance's moves, not the balance.
			continue
		}
		for _, l := range d.Limits {
			if l.Shadow || l.Degraded || l.Limit <= 0 {
				continue
			}
			st := m.states[wkey{l.Dimension, l.Identifier, l.RuleId}]
			if st == nil {
				// The common case: a subject that stays normal costs this lookup and no allocation.
				if l.Allowed && !m.th(l.RuleId).Enters(l.CurrentCount, l.Limit) {
					continue
				}
				st = &wstate{Dim: l.Dimension, ID: l.Identifier, Rule: l.RuleId}
				m.states[st.key()] = st
			} else if seq <= st.Seq && st.cur != seq {
				continue // saved with this message applied (the high-water mark was not)
			}
			m.step(st, d, l, seq)
		}
	}
	m.hw, m.hwDirty = seq, true
}

// step applies one limit of one decision to its state.
func (m *machine) step(st *wstate, d *quotaflowv1.Decision, l *quotaflowv1.LimitStatus, seq uint64) {
	st.dirty, st.Seq, st.cur = true, seq, seq
	t := d.TimeUs
	if t < st.Changed {
		return // older than the last change (a late decision): it changes nothing
	}
	m.fire(st, t) // the timers due by then come first, in event-time order
	th := m.th(st.Rule)
	usage := float64(l.CurrentCount) / float64(l.Limit)
	st.Tier, st.Last, st.Reset = d.Tier, max(st.Last, t), l.ResetAt*1e6
	st.Limit, st.Remaining, st.WindowMs, st.Usage = l.Limit, l.Remaining, l.WindowMs, usage
	switch {
	case !l.Allowed:
		until := t + l.RetryAfterMs*1000
		if st.State != stThrottled {
			st.Until = until
			m.change(st, stThrottled, t, causeDecision)
		} else {
			st.Until = max(st.Until, until)
		}
	case st.State == stNormal && th.Enters(l.CurrentCount, l.Limit): // the checker's answers use the same test
		m.change(st, stWarning, t, causeDecision)
	case st.State == stWarning && usage < th.Exit:
		m.change(st, stNormal, t, causeDecision)
	}
}

// fire runs the state's timers due at or before now (event time), in order: a throttled wait
// ending becomes warning (the window reset), or normal when the subject has been quiet for the
// quiet period by then; a warning whose limit is fully available again becomes normal.
func (m *machine) fire(st *wstate, now int64) {
	for {
		at := st.due()
		if at == 0 || at > now {
			return
		}
		switch st.State {
		case stThrottled:
			if at-st.Last >= m.th(st.Rule).QuietPeriod.Microseconds() {
				m.resetFigures(st)
				m.change(st, stNormal, at, causeTimer)
			} else {
				m.change(st, stWarning, at, causeTimer)
			}
		case stWarning:
			m.resetFigures(st)
			m.change(st, stNormal, at, causeTimer)
		}
		st.dirty = true
	}
}

// resetFigures reports a limit fully available: nothing used.
func (m *machine) resetFigures(st *wstate) {
	if st.Reset > 0 && st.Reset <= st.due() {
		st.Usage, st.Remaining = 0, st.Limit
	}
}

// tick runs every timer due at or before now (event time); it returns whether any fired.
func (m *machine) tick(now int64) bool {
	n := len(m.out)
	for _, st := range m.states {
		if at := st.due(); at != 0 && at <= now {
			m.fire(st, now)
		}
	}
	return len(m.out) > n
}

func (m *machine) change(st *wstate, to uint8, at int64, cause string) {
	from := st.State
	st.State, st.Changed = to, at
	if to != stThrottled {
		st.Until = 0
	}
	m.out = append(m.out, transition{from: from, to: to, ev: events.Transition{
		ID:   transitionID(m.stream, st, at, to),
		Tier: st.Tier, Dimension: stream.DimensionName(st.Dim), Subject: st.ID, RuleID: st.Rule,
		From: stateNames[from], To: stateNames[to], UsageRatio: st.Usage, Limit: st.Limit,
		Remaining: st.Remaining, WindowMs: st.WindowMs, At: time.UnixMicro(at).UTC(), Cause: cause,
	}})
}

// transitionID names a transition by what it is, not by who computed it: the subject, rule,
// instant and new state. Any aggregator that recomputes it gets the same id, which the events
// stream uses to drop the copy.
func transitionID(stream string, st *wstate, at int64, to uint8) string {
	h := sha256.New()
	for _, s := range []string{stream, strconv.Itoa(int(st.Dim)), st.ID, st.Rule, strconv.FormatInt(at, 10), stateNames[to]} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return "wt-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// settled removes from memory the states that are normal with no timer left, once saved.
func (m *machine) settled(st *wstate) bool { return st.State == stNormal && st.due() == 0 }
