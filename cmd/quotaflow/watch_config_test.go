package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

// TestWatchConfig: `quotaflow watch config` prints the rule store's configuration changes,
// one line each naming the action, the target and the actor, or their JSON.
func TestWatchConfig(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := rulestoretest.SeededOn(t, js, warningRules)
	if err := store.SetUserTier(ctx, "carol", "free", "alice-ops"); err != nil {
		t.Fatal(err)
	}

	out, stderr, code := runCmd(ctx, []string{"watch", "config", "--nats-url", ns.URL, "--all", "--count", "2"}, nil)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "RULES_SEEDED") || !strings.Contains(lines[0], "by seed") ||
		!strings.Contains(lines[1], "USER_TIER_SET user carol tier=free") || !strings.Contains(lines[1], "by alice-ops") {
		t.Errorf("watch config: exit %d, %q %s; want the seeding, then carol's tier set by alice-ops", code, out, stderr)
	}
	out, stderr, code = runCmd(ctx, []string{"watch", "config", "--nats-url", ns.URL, "--all", "--count", "1", "--json"}, nil)
	var ev events.ConfigEvent
	if err := json.Unmarshal([]byte(out), &ev); code != 0 || err != nil || ev.Action != events.ConfigRulesSeeded {
		t.Errorf("watch config --json: exit %d, %q %s (%v); want the seeding's JSON", code, out, stderr, err)
	}
}
