package rules

import (
	"strings"
	"testing"
	"time"
)

// TestOnLimitDelay: on_limit: delay makes a gcra or leaky_bucket rule a queue of max_delay;
// what cannot queue is refused naming the field.
func TestOnLimitDelay(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`
rules:
  - {id: q, dimension: user, endpoint: /x, algorithm: gcra, limit: 10, window: 1s, on_limit: delay, max_delay: 500ms}
  - {id: d, dimension: user, endpoint: /y, algorithm: leaky_bucket, limit: 10, window: 1s, on_limit: deny}
`))
	if err != nil {
		t.Fatal(err)
	}
	q, _ := s.Rule("q")
	if q.MaxDelay != 500*time.Millisecond {
		t.Errorf("max delay %v, want 500ms", q.MaxDelay)
	}
	if d, _ := s.Rule("d"); d.MaxDelay != 0 {
		t.Errorf("a denying rule's max delay = %v, want 0", d.MaxDelay)
	}
	const rule = "{id: a, dimension: user, endpoint: /x, limit: 10, window: 1s, "
	for _, tt := range []struct {
		name, fields, want string
	}{
		{"max delay above the window", "algorithm: gcra, on_limit: delay, max_delay: 2s}", `rule "a" (rules[0]): max_delay: 2s is above the rule's window (1s)`},
		{"no max delay", "algorithm: gcra, on_limit: delay}", "max_delay: required with on_limit: delay"},
		{"max delay of a denying rule", "algorithm: gcra, max_delay: 100ms}", "max_delay: only a rule with on_limit: delay waits"},
		{"unknown on_limit", "algorithm: gcra, on_limit: queue, max_delay: 100ms}", `on_limit: want deny or delay, got "queue"`},
		{"window algorithm", "algorithm: fixed_window, on_limit: delay, max_delay: 100ms}", "on_limit: delay spaces checks with a leaky bucket used as a queue: algorithm gcra or leaky_bucket, not fixed_window"},
		{"bad duration", "algorithm: gcra, on_limit: delay, max_delay: soon}", `max_delay: want a Go duration such as 250ms or 1s, got "soon"`},
		{"sub-millisecond", "algorithm: gcra, on_limit: delay, max_delay: 500us}", "max_delay: want a whole number of milliseconds"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte("rules:\n  - " + rule + tt.fields))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
