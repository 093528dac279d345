package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const warningRules = `
default_tier: free
tiers: {free: {}}
warnings: {enter: 0.5, exit: 0.4}
rules:
  - {id: per-user, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 100, window: 1m}
`

// TestAggregatorWarningsAndOverrides runs `quotaflow aggregator` on its own NATS: it applies the
// rule store's thresholds (60% used is a warning with enter 0.5, not with the default 0.8),
// publishes the override expiry of an override it did not create, and stores both kinds of
// events in ClickHouse; `quotaflow watch warnings` and `watch overrides` print them.
func TestAggregatorWarningsAndOverrides(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	js := ns.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store := rulestoretest.SeededOn(t, js, warningRules)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "QUOTAFLOW_DECISIONS", Subjects: []string{"quotaflow.decisions.>"}}); err != nil {
		t.Fatal(err)
	}
	db := databaseName("warn")
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{Partitions: 1, WarningGrace: 100 * time.Millisecond, FlushInterval: 100 * time.Millisecond,
			InsertTimeout: time.Second, PinnedTTL: 2 * time.Second, AckWait: 3 * time.Second}})

	now := time.Now()
	batch := &quotaflowv1.DecisionBatch{Decisions: []*quotaflowv1.Decision{{
		Id: "d1", TimeUs: now.UnixMicro(), Tier: "free", Allowed: true, RuleId: "per-user",
		Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "carol"},
		Limits: []*quotaflowv1.LimitStatus{{RuleId: "per-user", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "carol",
			Limit: 100, CurrentCount: 60, Remaining: 40, Allowed: true, WindowMs: 60000, ResetAt: now.Add(time.Minute).Unix()}},
	}}}
	data, _ := proto.Marshal(batch)
	if _, err := js.Publish(ctx, "quotaflow.decisions.0", data); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runCmd(ctx, []string{"watch", "warnings", "--nats-url", ns.URL, "--all", "--count", "1"}, nil)
	if code != 0 || !strings.Contains(out, "user:carol") || !strings.Contains(out, "normal    → warning") ||
		!strings.Contains(out, "usage=0.60 40/100") || !strings.Contains(out, "cause=decision") ||
		stderr != "watching warnings on "+ns.URL+" from the oldest kept; stops after 1\n" {
		t.Errorf("watch warnings: exit %d, %q %s; want carol normal → warning at usage 0.60", code, out, stderr)
	}

	// Expiring 3 s after the truncated second: at least 2 s away when stored, since the store
	// refuses an override that would expire within a second (2 s after the truncated second was
	// as little as 1 s away, and refused on a slow run).
	created := time.Now().Truncate(time.Second)
	if err := store.PutOverride(ctx, rules.Override{ID: "ov-carol", Dimension: "user", Identifier: "carol", Multiplier: 2,
		Reason: "launch", Creator: "ops", Source: "admin", CreatedAt: created, ExpiresAt: created.Add(3 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	out, stderr, code = runCmd(ctx, []string{"watch", "overrides", "--nats-url", ns.URL, "--all", "--count", "2"}, nil)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "CREATED") || !strings.Contains(lines[1], "EXPIRED") ||
		!strings.Contains(lines[0], "user:carol") || !strings.Contains(lines[0], `reason="launch"`) {
		t.Errorf("watch overrides: exit %d, %q %s; want the override created, then expired", code, out, stderr)
	}

	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tt := range []struct {
		query string
		want  uint64
	}{
		{"SELECT count() FROM %s.state_transitions WHERE subject = 'carol' AND to_state = 'warning' AND rule_id = 'per-user'", 1},
		{"SELECT count() FROM %s.overrides WHERE override_id = 'ov-carol' AND action IN ('created', 'expired')", 2},
	} {
		var got uint64
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if c.QueryRow(ctx, fmt.Sprintf(tt.query, db)).Scan(&got) == nil && got >= tt.want {
				break
			}
		}
		if got != tt.want {
			t.Errorf("%s = %d, want %d", fmt.Sprintf(tt.query, db), got, tt.want)
		}
	}
}

func TestWatchAndAggregatorUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown stream", []string{"watch", "alerts"}, "want `quotaflow watch decisions|warnings|overrides|config|entitlements`"},
		{"negative grace", []string{"aggregator", "--warning-grace", "-1s"}, "--warning-grace"},
		{"warnings help", []string{"watch", "warnings", "--help"}, "quotaflow.warnings.>"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, _ := runCmd(context.Background(), tt.args, nil)
			if got := out + stderr; !strings.Contains(got, tt.want) {
				t.Errorf("quotaflow %v: %q, want %q", tt.args, got, tt.want)
			}
		})
	}
}
