package aggregator_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

// storeRules lowers the warning threshold to half the limit (the default is 0.8) and has a
// penalty policy, so that each of the rule store's tasks shows in what the aggregator does.
const storeRules = `
default_tier: free
tiers: {free: {}}
warnings: {enter: 0.5, exit: 0.4}
policies:
  penalty: {throttled: 400ms, within: 5s, factor: 0.5, duration: 2s}
rules:
  - {id: r1, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 100, window: 10s}
`

// TestRuleStoreTasks runs an aggregator given only the rule store: the store's threshold
// judges the first decision (published before the aggregator starts), an override's expiry is
// published, the penalty policy makes its override, and every log line names its component
// once.
func TestRuleStoreTasks(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, storeRules)
	ctx := context.Background()
	e := newEnvOn(t, js)
	now := time.Now()
	// 60 of 100 is a warning only under the store's enter 0.5.
	e.publishDecisions(0, limitAt{t: now, subject: "carol", rule: "r1", count: 60, reset: now.Add(10 * time.Second)})
	publishTransition(t, js, "abuser", events.StateWarning, events.StateThrottled, now.Add(-time.Second))

	var logs syncBuffer
	cfg := e.config("rules")
	cfg.RuleStore = store
	cfg.PolicyInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	_, stop := e.startWith(cfg)

	// Expiring 3 s after the truncated second: at least 2 s away when stored, since the store
	// refuses an override that would expire within a second (2 s after the truncated second
	// was as little as 1 s away, and refused on a slow run).
	created := time.Now().Truncate(time.Second)
	if err := store.PutOverride(ctx, rules.Override{ID: "ov-carol", Dimension: "user", Identifier: "carol", Multiplier: 2,
		Reason: "launch", Creator: "ops", Source: "admin", CreatedAt: created, ExpiresAt: created.Add(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}

	if got := describe(e.waitTransitions(1)); len(got) != 1 || got[0] != "carol:normal>warning/decision" {
		t.Errorf("transitions %v, want carol normal>warning at 60%% (the store's threshold)", got)
	}
	poll.Until(t, 20*time.Second, "want a penalty for abuser", overridesWhere(store, nil, func(ovs []rules.Override) bool {
		for _, o := range ovs {
			if o.Source == "penalty" && o.Identifier == "abuser" {
				return true
			}
		}
		return false
	}))
	var actions string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if actions = overrideActions(t, js, "ov-carol"); actions == "created,expired" {
			break
		}
	}
	if actions != "created,expired" {
		t.Errorf("events of ov-carol: %q, want created,expired", actions)
	}

	stop()
	out := logs.String()
	if !strings.Contains(out, "component=aggregator") || !strings.Contains(out, "component=policies") {
		t.Errorf("logs name neither the aggregator nor the policies as component:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Count(line, "component=") > 1 {
			t.Errorf("component named twice: %s", line)
		}
	}
}

// TestConfigRuleStore: the zero Config needs no rule store; a rule store and a Rules function
// together are refused rather than one of them silently ignored.
func TestConfigRuleStore(t *testing.T) {
	t.Parallel()
	store, _, set := policyStore(t)
	fixed := func() *rules.Set { return set }
	for _, tt := range []struct {
		name    string
		cfg     aggregator.Config
		wantErr string
	}{
		{"zero", aggregator.Config{}, ""},
		{"rule store", aggregator.Config{RuleStore: store}, ""},
		{"fixed rules", aggregator.Config{Rules: fixed}, ""},
		{"both", aggregator.Config{RuleStore: store, Rules: fixed}, "exclusive"},
		{"negative policy interval", aggregator.Config{RuleStore: store, PolicyInterval: -time.Second}, "negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := aggregator.New(nil, nil, tt.cfg)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("New: %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer that the aggregator's goroutines may log to at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
