package dashboard

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// topBoard is what quotaflow top shows: the checks of each subject over a sliding window, kept
// as one slot per second, and the subjects whose last warning transition left them throttled
// or warned. Its methods are safe for concurrent use: the stream's callbacks feed it while the
// screen reads it.
type topBoard struct {
	window time.Duration

	mu        sync.Mutex
	slots     map[int64]map[string]*subjectCounts // unix second → subject → counts
	throttles map[string]events.Transition        // subject and rule → its last transition, while not normal
	note      string                              // a line on what cannot be shown, "" for none
}

// subjectCounts are one subject's checks.
type subjectCounts struct {
	allowed, denied int64
}

func newTopBoard(window time.Duration) *topBoard {
	return &topBoard{window: window, slots: map[int64]map[string]*subjectCounts{}, throttles: map[string]events.Transition{}}
}

// addBatch counts the checks of a batch of decisions, arrived at now: settlements, releases
// and other records that are not checks are not counted.
func (b *topBoard) addBatch(now time.Time, batch *quotaflowv1.DecisionBatch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sec := now.Unix()
	slot := b.slots[sec]
	if slot == nil {
		slot = map[string]*subjectCounts{}
		b.slots[sec] = slot
		for s := range b.slots { // drop what slid out of the window
			if s <= sec-int64(b.window/time.Second) {
				delete(b.slots, s)
			}
		}
	}
	for _, d := range batch.Decisions {
		if d.Kind != quotaflowv1.Kind_KIND_UNSPECIFIED && d.Kind != quotaflowv1.Kind_KIND_RESERVE {
			continue
		}
		key := subjectName(d.Subject)
		c := slot[key]
		if c == nil {
			c = &subjectCounts{}
			slot[key] = c
		}
		if d.Allowed {
			c.allowed++
		} else {
			c.denied++
		}
	}
}

// subjectName is a subject as people write it: dimension:identifier.
func subjectName(s *quotaflowv1.Subject) string {
	if s == nil {
		return "-"
	}
	dim := s.CustomDimension
	if dim == "" {
		dim = strings.ToLower(strings.TrimPrefix(s.Dimension.String(), "DIMENSION_"))
	}
	return dim + ":" + s.Identifier
}

// applyTransition keeps a subject's rule while it is warned or throttled, drops it when normal.
func (b *topBoard) applyTransition(t events.Transition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := t.Dimension + ":" + t.Subject + "\x00" + t.RuleID
	if t.To == events.StateNormal {
		delete(b.throttles, key)
		return
	}
	if prev, ok := b.throttles[key]; ok && prev.At.After(t.At) {
		return
	}
	b.throttles[key] = t
}

// setNote sets the line on what cannot be shown.
func (b *topBoard) setNote(note string) {
	b.mu.Lock()
	b.note = note
	b.mu.Unlock()
}

// busyRow is one subject's line.
type busyRow struct {
	subject         string
	allowed, denied int64
}

// frame renders the board at now as lines of at most width characters (0: no bound), with at
// most rows subjects; the title ends with hint, how to stop (a screen's "q quits"; a snapshot
// piped elsewhere has none).
func (b *topBoard) frame(now time.Time, width, rows int, hint string) []string {
	busy, throttles, note := b.read(now)
	secs := b.window.Seconds()
	lines := []string{
		strings.TrimSpace(fmt.Sprintf("quotaflow top  %s  window %s  %s", now.Format(time.TimeOnly), b.window, hint)),
		"",
		fmt.Sprintf("BUSIEST SUBJECTS (%d)", len(busy)),
		fmt.Sprintf("%-36s %10s %10s %10s", "SUBJECT", "CHECKS/S", "ALLOWED", "DENIED"),
	}
	for i, r := range busy {
		if i == rows {
			lines = append(lines, fmt.Sprintf("… %d more", len(busy)-rows))
			break
		}
		lines = append(lines, fmt.Sprintf("%-36s %10.1f %10d %10d", r.subject, float64(r.allowed+r.denied)/secs, r.allowed, r.denied))
	}
	lines = append(lines, "", fmt.Sprintf("CURRENT THROTTLES (%d)", len(throttles)),
		fmt.Sprintf("%-10s %-36s %-20s %-10s %7s  %s", "STATE", "SUBJECT", "RULE", "TIER", "USAGE", "SINCE"))
	for i, t := range throttles {
		if i == rows {
			lines = append(lines, fmt.Sprintf("… %d more", len(throttles)-rows))
			break
		}
		lines = append(lines, fmt.Sprintf("%-10s %-36s %-20s %-10s %6.0f%%  %s", t.To, t.Dimension+":"+t.Subject, t.RuleID, t.Tier,
			100*t.UsageRatio, t.At.Local().Format(time.TimeOnly)))
	}
	if note != "" {
		lines = append(lines, "", note)
	}
	if width > 0 {
		for i, l := range lines {
			if r := []rune(l); len(r) > width {
				lines[i] = string(r[:width])
			}
		}
	}
	return lines
}

// read returns, as of now, the subjects' sums over the window, the busiest first, the
// throttles, throttled before warned and then the most recent first, and the note.
func (b *topBoard) read(now time.Time) (busy []*busyRow, throttles []events.Transition, note string) {
	b.mu.Lock()
	from := now.Unix() - int64(b.window/time.Second)
	sums := map[string]*busyRow{}
	for sec, slot := range b.slots {
		if sec <= from {
			continue
		}
		for subj, c := range slot {
			r := sums[subj]
			if r == nil {
				r = &busyRow{subject: subj}
				sums[subj] = r
			}
			r.allowed += c.allowed
			r.denied += c.denied
		}
	}
	throttles = make([]events.Transition, 0, len(b.throttles))
	for _, t := range b.throttles {
		throttles = append(throttles, t)
	}
	note = b.note
	b.mu.Unlock()

	busy = make([]*busyRow, 0, len(sums))
	for _, r := range sums {
		busy = append(busy, r)
	}
	slices.SortFunc(busy, func(x, y *busyRow) int {
		if c := cmp.Compare(y.allowed+y.denied, x.allowed+x.denied); c != 0 {
			return c
		}
		return cmp.Compare(x.subject, y.subject)
	})
	slices.SortFunc(throttles, func(x, y events.Transition) int {
		if x.To != y.To {
			return cmp.Compare(stateRank(x.To), stateRank(y.To))
		}
		return y.At.Compare(x.At)
	})
	return busy, throttles, note
}

func stateRank(s string) int {
	if s == events.StateThrottled {
		return 0
	}
	return 1
}
