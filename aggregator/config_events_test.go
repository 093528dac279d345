package aggregator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

// TestConfigEventsStored: the rule store's config events land in config_changes once each,
// alongside override events and warning transitions in their tables, with the default
// subjects; neither a late copy (same event id, new Nats-Msg-Id) nor the redelivery of the
// whole stream stores one twice.
func TestConfigEventsStored(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, storeRules)
	ctx := context.Background()
	r2 := rules.DocRule{ID: "r2", Dimension: "ip", Endpoint: "*", Algorithm: "gcra", Limit: "5", Window: "1s"}
	for _, write := range []func() error{
		func() error { return store.CreateRule(ctx, r2, "alice-ops") },
		func() error { return store.SetUserTier(ctx, "bob", "free", "ci-pipeline") },
		func() error { return store.DeleteRule(ctx, "r2", "alice-ops") },
		func() error { return store.DeleteRule(ctx, "r2", "alice-ops") }, // refused: no event
	} {
		if err := write(); err != nil && !errors.Is(err, rules.ErrNotFound) {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	if err := store.PutOverride(ctx, rules.Override{ID: "ov-bob", Dimension: "user", Identifier: "bob", Multiplier: 2,
		Reason: "launch", Creator: "alice-ops", Source: "admin", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, js)
	tr := events.Transition{ID: e.stream + "-tr", Tier: e.tier, Dimension: "user", Subject: "bob", RuleID: "r1",
		From: events.StateNormal, To: events.StateWarning, At: now, Cause: "decision"}
	if err := events.Publish(ctx, js, tr.NATSSubject(), tr.ID, tr); err != nil {
		t.Fatal(err)
	}

	cfg := e.config("config")
	cfg.EventsSubjects = nil // the default: every event
	a, stop := e.startWith(cfg)
	tables := []rowCount{
		{"SELECT count() FROM %s.config_changes", 4}, // seeded, created, tier set, deleted
		{"SELECT uniqExact(event_id) FROM %s.config_changes", 4},
		{"SELECT count() FROM %s.overrides", 1},
		{"SELECT count() FROM %s.state_transitions", 1},
	}
	// checkRows waits until every table holds its rows, then checks it holds no more.
	checkRows := func(when string) {
		t.Helper()
		poll.Until(t, 30*time.Second, when, func() error {
			if i := slices.IndexFunc(tables, func(c rowCount) bool { return e.count(c.query) < c.want }); i >= 0 {
				return fmt.Errorf("%s: fewer than %d", fmt.Sprintf(tables[i].query, e.db), tables[i].want)
			}
			return nil
		})
		time.Sleep(300 * time.Millisecond) // a duplicate would arrive meanwhile
		for _, tt := range tables {
			if got := e.count(tt.query); got != tt.want {
				t.Errorf("%s: %s = %d, want %d", when, fmt.Sprintf(tt.query, e.db), got, tt.want)
			}
		}
	}
	checkRows("first delivery")
	if got := a.Stats().EventsStored; got != 6 {
		t.Errorf("stats: %d events stored, want 6", got)
	}

	var rows []string
	res, err := e.ch.Query(ctx, fmt.Sprintf("SELECT action, actor, target, tier, detail FROM %s.config_changes ORDER BY stream_seq", e.db))
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var action, actor, target, tier, detail string
		if err := res.Scan(&action, &actor, &target, &tier, &detail); err != nil {
			t.Fatal(err)
		}
		if !json.Valid([]byte(detail)) {
			t.Errorf("%s: detail %q is not JSON", action, detail)
		}
		rows = append(rows, fmt.Sprintf("%s by %s: %q %q", action, actor, target, tier))
	}
	res.Close()
	want := []string{
		`rules_seeded by seed: "" ""`,
		`rule_created by alice-ops: "r2" ""`,
		`user_tier_set by ci-pipeline: "bob" "free"`,
		`rule_deleted by alice-ops: "r2" ""`,
	}
	if !slices.Equal(rows, want) {
		t.Errorf("config_changes:\n got %q\nwant %q", rows, want)
	}

	// A copy of a stored event past the stream's duplicate window: a message the stream keeps.
	ev := lastConfigEvent(t, js)
	if err := events.Publish(ctx, js, ev.NATSSubject(), ev.ID+"-late", ev); err != nil {
		t.Fatal(err)
	}
	// Redelivery of the whole stream: a new consumer of the same name.
	stop()
	if err := js.DeleteConsumer(ctx, events.Stream, cfg.EventsConsumer); err != nil {
		t.Fatal(err)
	}
	cfg.InstanceID = "config-again"
	b, _ := e.startWith(cfg)
	if err := store.SetUserTier(ctx, "carol", "free", "alice-ops"); err != nil {
		t.Fatal(err)
	}
	tables[0].want, tables[1].want = 5, 5
	checkRows("after redelivery")
	if got := b.Stats().EventsStored; got != 1 {
		t.Errorf("second aggregator stored %d events, want only the new one", got)
	}
}

// TestEventsStreamUpgrade: an aggregator finding an events stream made before config events
// adds their subjects to it, keeping its other settings, and stores them.
func TestEventsStreamUpgrade(t *testing.T) {
	t.Parallel()
	js := natstest.JetStream(t) // the events stream's name is fixed
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: events.Stream, Subjects: []string{events.WarningsPrefix + ".>", events.OverridesPrefix + ".>"},
		Storage: jetstream.FileStorage, MaxAge: time.Hour, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, js)
	cfg := e.config("upgrade")
	cfg.EventsSubjects = nil
	e.startWith(cfg)
	deadline := time.Now().Add(10 * time.Second)
	var info *jetstream.StreamInfo
	for {
		st, err := js.Stream(ctx, events.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if info = st.CachedInfo(); slices.Contains(info.Config.Subjects, events.ConfigPrefix+".>") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := info.Config.Subjects; !slices.Equal(got, events.Subjects()) || info.Config.MaxAge != time.Hour {
		t.Fatalf("events stream: subjects %v, max age %v; want %v and the hour it had", got, info.Config.MaxAge, events.Subjects())
	}
	ev := &events.ConfigEvent{ID: e.stream + "-cfg", Action: events.ConfigRuleDeleted, At: time.Now().UTC(), Actor: "alice-ops", RuleID: "r9"}
	if err := events.Publish(ctx, js, ev.NATSSubject(), ev.ID, ev); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for e.count("SELECT count() FROM %s.config_changes WHERE target = 'r9' AND actor = 'alice-ops'") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the config event was not stored within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rowCount is a count query of a test's database (%s) and the count it should reach.
type rowCount struct {
	query string
	want  uint64
}

// lastConfigEvent reads the newest config event of the events stream.
func lastConfigEvent(t *testing.T, js jetstream.JetStream) *events.ConfigEvent {
	t.Helper()
	st, err := js.Stream(context.Background(), events.Stream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetLastMsgForSubject(context.Background(), events.ConfigPrefix+".>")
	if err != nil {
		t.Fatal(err)
	}
	var ev events.ConfigEvent
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return &ev
}
