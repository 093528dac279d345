package aggregator

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// step is one input of a state machine test: a decision of subject u1 on rule r1 (limit 100)
// at ms milliseconds, or with tick set, the timers run up to ms.
type step struct {
	ms     int64
	count  int64 // current_count of 100
	denied bool
	retry  int64 // retry_after_ms of a denial
	reset  int64 // reset_at, in ms (rounded up to the second as the checker does)
	tick   bool
	shadow bool
}

func decisionAt(s step) *quotaflowv1.Decision {
	reset := s.reset
	if reset == 0 {
		reset = s.ms + 1000
	}
	return &quotaflowv1.Decision{
		Id: fmt.Sprint(s.ms), TimeUs: s.ms * 1000, Tier: "free", Allowed: !s.denied,
		Limits: []*quotaflowv1.LimitStatus{{
			RuleId: "r1", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "u1", Limit: 100,
			CurrentCount: s.count, Remaining: 100 - s.count, Allowed: !s.denied, RetryAfterMs: s.retry,
			ResetAt: (reset + 999) / 1000, WindowMs: 1000, Shadow: s.shadow,
		}},
	}
}

// run feeds the steps to a fresh machine, one stream message each, and returns the
// transitions as "from>to@ms/cause".
func run(th rules.Thresholds, steps []step) []string {
	m := newMachine("S")
	m.th = func(string) rules.Thresholds { return th }
	for i, s := range steps {
		if s.tick {
			m.tick(s.ms * 1000)
			continue
		}
		m.apply(uint64(i+1), []*quotaflowv1.Decision{decisionAt(s)})
	}
	var got []string
	for _, t := range m.out {
		got = append(got, fmt.Sprintf("%s>%s@%d/%s", t.ev.From, t.ev.To, t.ev.At.UnixMilli(), t.ev.Cause))
	}
	return got
}

// TestStateMachine walks every transition of the state machine (docs/warnings.md), the hysteresis, the
// timers, late and redelivered decisions.
func TestStateMachine(t *testing.T) {
	t.Parallel()
	def := rules.DefaultThresholds
	for _, tt := range []struct {
		name  string
		th    rules.Thresholds
		steps []step
		want  []string
	}{
		{"stays normal at the threshold", def, []step{{ms: 1000, count: 50}, {ms: 1100, count: 80}}, nil},
		{"normal to warning above enter", def, []step{{ms: 1000, count: 81}}, []string{"normal>warning@1000/decision"}},
		{"hysteresis: between exit and enter stays warning", def,
			[]step{{ms: 1000, count: 85}, {ms: 1100, count: 75}, {ms: 1200, count: 70}, {ms: 1300, count: 82}},
			[]string{"normal>warning@1000/decision"}},
		{"warning to normal below exit", def, []step{{ms: 1000, count: 85}, {ms: 1100, count: 69}},
			[]string{"normal>warning@1000/decision", "warning>normal@1100/decision"}},
		{"warning to throttled on a denial", def, []step{{ms: 1000, count: 90}, {ms: 1100, count: 100, denied: true, retry: 500}},
			[]string{"normal>warning@1000/decision", "warning>throttled@1100/decision"}},
		{"normal straight to throttled is one event", def, []step{{ms: 1000, count: 100, denied: true, retry: 500}},
			[]string{"normal>throttled@1000/decision"}},
		{"denials while throttled extend the wait", def,
			[]step{{ms: 1000, count: 100, denied: true, retry: 500}, {ms: 1400, count: 100, denied: true, retry: 500}, {ms: 1500, count: 100, denied: true, retry: 400}, {ms: 2000, tick: true}},
			[]string{"normal>throttled@1000/decision", "throttled>warning@1900/timer"}},
		{"throttled to warning when the wait ends, by timer without traffic", def,
			[]step{{ms: 1000, count: 100, denied: true, retry: 500, reset: 9000}, {ms: 1499, tick: true}, {ms: 1500, tick: true}},
			[]string{"normal>throttled@1000/decision", "throttled>warning@1500/timer"}},
		{"throttled to normal after the quiet period", rules.Thresholds{Enter: 0.8, Exit: 0.7, QuietPeriod: 300 * time.Millisecond},
			[]step{{ms: 1000, count: 100, denied: true, retry: 500, reset: 9000}, {ms: 2000, tick: true}},
			[]string{"normal>throttled@1000/decision", "throttled>normal@1500/timer"}},
		{"warning to normal when the limit is fully available again", def,
			[]step{{ms: 1000, count: 90, reset: 3000}, {ms: 2999, tick: true}, {ms: 3000, tick: true}},
			[]string{"normal>warning@1000/decision", "warning>normal@3000/timer"}},
		{"full recovery without traffic", def,
			[]step{{ms: 1000, count: 90, reset: 4000}, {ms: 1100, count: 100, denied: true, retry: 900, reset: 4000}, {ms: 10000, tick: true}},
			[]string{"normal>warning@1000/decision", "warning>throttled@1100/decision", "throttled>warning@2000/timer", "warning>normal@4000/timer"}},
		{"a decision after the wait fires the timer first, at its instant", def,
			[]step{{ms: 1000, count: 100, denied: true, retry: 500, reset: 5000}, {ms: 1700, count: 20, reset: 5000}},
			[]string{"normal>throttled@1000/decision", "throttled>warning@1500/timer", "warning>normal@1700/decision"}},
		{"an allowed decision inside the wait stays throttled", def,
			[]step{{ms: 1000, count: 100, denied: true, retry: 500}, {ms: 1200, count: 10}},
			[]string{"normal>throttled@1000/decision"}},
		{"a late decision changes nothing", def,
			[]step{{ms: 1000, count: 90}, {ms: 900, count: 10}},
			[]string{"normal>warning@1000/decision"}},
		{"shadow limits are not states", def, []step{{ms: 1000, count: 100, denied: true, shadow: true}}, nil},
		{"per-rule thresholds", rules.Thresholds{Enter: 0.5, Exit: 0.2, QuietPeriod: time.Second},
			[]step{{ms: 1000, count: 51}, {ms: 1100, count: 30}, {ms: 1200, count: 19}},
			[]string{"normal>warning@1000/decision", "warning>normal@1200/decision"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(tt.th, tt.steps); !slices.Equal(got, tt.want) {
				t.Errorf("transitions\n got %s\nwant %s", strings.Join(got, " "), strings.Join(tt.want, " "))
			}
		})
	}
}

// TestStateMachineReplay: a message at or below the applied sequence changes nothing, and the
// same inputs from the same state give the same ids; a normal subject leaves no state.
func TestStateMachineReplay(t *testing.T) {
	t.Parallel()
	m := newMachine("S")
	m.apply(1, []*quotaflowv1.Decision{decisionAt(step{ms: 1000, count: 90})})
	m.apply(1, []*quotaflowv1.Decision{decisionAt(step{ms: 1100, count: 10})}) // redelivered seq
	if len(m.out) != 1 || len(m.states) != 1 {
		t.Fatalf("after a redelivery: %d transitions, %d states; want 1 and 1", len(m.out), len(m.states))
	}
	again := newMachine("S")
	again.apply(1, []*quotaflowv1.Decision{decisionAt(step{ms: 1000, count: 90})})
	if got, want := again.out[0].ev.ID, m.out[0].ev.ID; got != want {
		t.Errorf("recomputed id %s, want %s", got, want)
	}
	quiet := newMachine("S")
	quiet.apply(1, []*quotaflowv1.Decision{decisionAt(step{ms: 1000, count: 10})})
	if len(quiet.states) != 0 || len(quiet.out) != 0 {
		t.Errorf("a normal subject left %d states, %d transitions; want none", len(quiet.states), len(quiet.out))
	}
}

// TestStateMachineOneMessage: several decisions of one subject in one stream message all apply;
// a message saved for a key but above the saved high-water mark does not apply again.
func TestStateMachineOneMessage(t *testing.T) {
	t.Parallel()
	m := newMachine("S")
	m.apply(7, []*quotaflowv1.Decision{decisionAt(step{ms: 1000, count: 90}), decisionAt(step{ms: 1100, count: 10})})
	if len(m.out) != 2 {
		t.Errorf("one message of two decisions made %d transitions, want 2", len(m.out))
	}
	loaded := newMachine("S")
	st := &wstate{State: stWarning, Changed: 1000 * 1000, Last: 1000 * 1000, Seq: 7, Dim: quotaflowv1.Dimension_DIMENSION_USER, ID: "u1", Rule: "r1"}
	loaded.states[st.key()], loaded.hw = st, 6
	loaded.apply(7, []*quotaflowv1.Decision{decisionAt(step{ms: 1100, count: 10})})
	if len(loaded.out) != 0 || st.State != stWarning {
		t.Errorf("message 7 applied again to a state saved with it: %d transitions, state %d", len(loaded.out), st.State)
	}
}

// BenchmarkMachineNormal measures the cost of a decision whose subject stays normal.
func BenchmarkMachineNormal(b *testing.B) {
	m := newMachine("S")
	ds := []*quotaflowv1.Decision{decisionAt(step{ms: 1000, count: 10})}
	b.ReportAllocs()
	for i := range b.N {
		m.apply(uint64(i+1), ds)
	}
}
