package aggregator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// limitAt is one decision of one subject on one rule (limit 100) at t.
type limitAt struct {
	t       time.Time
	subject string
	rule    string
	count   int64
	denied  bool
	retry   time.Duration
	reset   time.Time
}

// publishDecisions puts one message of decisions on partition p.
func (e *env) publishDecisions(p int, ls ...limitAt) {
	e.t.Helper()
	var b quotaflowv1.DecisionBatch
	for _, l := range ls {
		id := e.seq.Add(1)
		lim := &quotaflowv1.LimitStatus{
			RuleId: l.rule, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: l.subject, Limit: 100,
			CurrentCount: l.count, Remaining: 100 - l.count, Allowed: !l.denied, RetryAfterMs: l.retry.Milliseconds(),
			ResetAt: (l.reset.UnixMilli() + 999) / 1000, WindowMs: 10000,
		}
		b.Decisions = append(b.Decisions, &quotaflowv1.Decision{
			Id: fmt.Sprintf("w-%d", id), CheckerId: "test", TimeUs: l.t.UnixMicro(),
			Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: l.subject},
			Tier:    e.tier, Endpoint: "/orders", RuleId: l.rule, Cost: 1, Allowed: !l.denied, Limit: 100,
			Limits: []*quotaflowv1.LimitStatus{lim},
		})
	}
	data, err := proto.Marshal(&b)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.ids++
	n := e.ids
	e.mu.Unlock()
	msg := &nats.Msg{Subject: fmt.Sprintf("%s.%d", e.prefix, p), Data: data, Header: nats.Header{}}
	if _, err := e.js.PublishMsg(context.Background(), msg, jetstream.WithMsgID(fmt.Sprintf("w.%d", n))); err != nil {
		e.t.Fatal(err)
	}
}

// transitions reads every warning event of the test's tier kept in the events stream.
func (e *env) transitions() []events.Transition {
	e.t.Helper()
	ctx := context.Background()
	oc, err := e.js.OrderedConsumer(ctx, events.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.WarningsPrefix + "." + e.tier + ".>"},
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // the aggregator has not created it yet
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var ts []events.Transition
	for {
		batch, err := oc.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			e.t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			var tr events.Transition
			if err := json.Unmarshal(msg.Data(), &tr); err != nil {
				e.t.Fatal(err)
			}
			ts = append(ts, tr)
		}
		if n == 0 {
			return ts
		}
	}
}

// waitTransitions waits until the stream holds n of the test's transitions.
func (e *env) waitTransitions(n int) []events.Transition {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ts := e.transitions()
		if len(ts) >= n || time.Now().After(deadline) {
			return ts
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func describe(ts []events.Transition) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Subject+":"+t.From+">"+t.To+"/"+t.Cause)
	}
	return out
}

const quietRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: r1, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 100, window: 10s}
  - {id: rq, dimension: user, endpoint: "/q/*", algorithm: fixed_window, limit: 100, window: 10s, warning: {quiet_period: 300ms}}
`

// TestWarningTransitions scripts one subject through every transition (with the hysteresis)
// and a second through the quiet period, stops the aggregator while both are throttled and
// starts a successor: the recoveries come from its timers, with no traffic, and every
// transition is on the events stream and in state_transitions exactly once.
func TestWarningTransitions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		lostSave bool
	}{
		{"stopped", false},
		// The first aggregator's last saves are lost (as in a crash after it fetched and
		// published): its successor must catch up from the stream, and its recomputed
		// transitions must be dropped as the copies they are.
		{"saves lost", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			warningTransitions(t, tt.lostSave)
		})
	}
}

func warningTransitions(t *testing.T, lostSave bool) {
	e := newEnv(t)
	set, err := rules.Parse([]byte(quietRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.config("first")
	cfg.Rules = func() *rules.Set { return set }
	first, stopFirst := e.startWith(cfg)

	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	reset := at(6000)
	e.publishDecisions(1,
		limitAt{t: at(0), subject: "alice", rule: "r1", count: 85, reset: reset},  // normal → warning
		limitAt{t: at(10), subject: "alice", rule: "r1", count: 75, reset: reset}, // hysteresis: stays warning
	)
	e.publishDecisions(1, limitAt{t: at(20), subject: "alice", rule: "r1", count: 60, reset: reset}) // warning → normal
	e.publishDecisions(1, limitAt{t: at(30), subject: "alice", rule: "r1", count: 90, reset: reset}) // normal → warning
	e.publishDecisions(1,
		limitAt{t: at(40), subject: "alice", rule: "r1", count: 100, denied: true, retry: 3 * time.Second, reset: reset}, // warning → throttled
		limitAt{t: at(40), subject: "bob", rule: "rq", count: 100, denied: true, retry: 3 * time.Second, reset: reset},   // normal → throttled
	)
	before := e.waitTransitions(5)
	if got := len(before); got != 5 {
		t.Fatalf("before the restart: %d transitions %v, want 5", got, describe(before))
	}
	stopFirst() // while both are throttled, until t0+3040ms
	if s := first.Stats(); s.Transitions != 5 {
		t.Errorf("first aggregator counted %d transitions, want 5", s.Transitions)
	}
	if lostSave {
		e.rewindWarnings(1, 2) // as saved after the second message: alice back to normal
	}
	second, _ := e.startWith(func() aggregator.Config { c := cfg; c.InstanceID = "second"; return c }())

	e.waitTransitions(8)
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive meanwhile
	all := e.transitions()
	want := []string{
		"alice:normal>warning/decision", "alice:warning>normal/decision", "alice:normal>warning/decision",
		"alice:warning>throttled/decision", "bob:normal>throttled/decision",
		"alice:throttled>warning/timer", "bob:throttled>normal/timer", "alice:warning>normal/timer",
	}
	got := describe(all)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("transitions\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
	ids := map[string]bool{}
	for _, tr := range all {
		if ids[tr.ID] {
			t.Errorf("transition %s published twice", tr.ID)
		}
		ids[tr.ID] = true
		if tr.Tier != e.tier || tr.Dimension != "user" || tr.Limit != 100 {
			t.Errorf("transition %+v: want tier %s, dimension user, limit 100", tr, e.tier)
		}
	}
	if s := second.Stats(); s.Transitions != 3 { // recomputed copies are not counted
		t.Errorf("successor published %d transitions, want the 3 recoveries", s.Transitions)
	}
	for _, tr := range all {
		if tr.Cause == "timer" && tr.To == "warning" && !tr.At.Equal(at(3040).Truncate(time.Microsecond)) {
			t.Errorf("throttled → warning at %v, want the end of the wait %v", tr.At, at(3040))
		}
	}

	// ClickHouse: each transition once.
	deadline := time.Now().Add(30 * time.Second)
	for e.count("SELECT count() FROM %s.state_transitions") < 8 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	for _, tt := range []struct {
		query string
		want  uint64
	}{
		{"SELECT count() FROM %s.state_transitions", 8},
		{"SELECT uniqExact(id) FROM %s.state_transitions", 8},
		{"SELECT count() FROM %s.state_transitions WHERE from_state = 'throttled' AND cause = 'timer'", 2},
		{"SELECT count() FROM %s.state_transitions WHERE subject = 'alice' AND to_state = 'warning'", 3},
	} {
		if got := e.count(tt.query); got != tt.want {
			t.Errorf("%s = %d, want %d", fmt.Sprintf(tt.query, e.db), got, tt.want)
		}
	}
}

// rewindWarnings replaces partition p's saved warning states with none and a high-water mark
// of hw, as if the aggregator had died after saving message hw.
func (e *env) rewindWarnings(p int, hw uint64) {
	e.t.Helper()
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, e.stream+"_WARNINGS")
	if err != nil {
		e.t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(ctx, fmt.Sprintf("p%d.>", p))
	if err != nil {
		e.t.Fatal(err)
	}
	for k := range keys.Keys() {
		if err := kv.Delete(ctx, k); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, fmt.Sprintf("p%d.hw", p), []byte(fmt.Sprint(hw))); err != nil {
		e.t.Fatal(err)
	}
}

// TestEventsStored: override events are stored once each, whether the stream drops a copy (same
// Nats-Msg-Id), keeps a late re-publish (new message, same event id) or redelivers all of it.
func TestEventsStored(t *testing.T) {
	t.Parallel()
	// A NATS server of its own: the events stream's name is fixed, and the aggregator counts
	// every override event on it, those of other tests and of earlier runs (-count) too.
	e := newEnvOn(t, natstest.JetStream(t))
	ctx := context.Background()
	cfg := e.config("events")
	cfg.EventsSubjects = []string{events.OverridesPrefix + ".>"}
	a, stop := e.startWith(cfg)
	now := time.Now().UTC().Truncate(time.Second)
	var evs []*events.OverrideEvent
	for i, action := range []string{events.OverrideCreated, events.OverrideDeleted, events.OverrideExpired} {
		evs = append(evs, &events.OverrideEvent{
			ID: fmt.Sprintf("%s-ov-%d", e.stream, i), Action: action, At: now, Actor: "ops@example.com",
			Override: rules.Override{ID: "ov1", Dimension: "user", Identifier: "alice", RuleID: "r1", Multiplier: 2,
				Reason: "launch day", Creator: "ops@example.com", Source: "admin", CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
		})
	}
	// The stream as the aggregator makes it (create or update): its start may not have made it
	// yet, its migration first (on a loaded run the publish found no stream).
	if _, err := events.EnsureStream(ctx, e.js, 1); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if err := events.Publish(ctx, e.js, ev.NATSSubject(), ev.ID, ev); err != nil {
			t.Fatal(err)
		}
	}
	// The same event again: the stream drops it. Then a copy past the duplicate window (a new
	// Nats-Msg-Id): the stream keeps it, the lookup must not.
	if err := events.Publish(ctx, e.js, evs[0].NATSSubject(), evs[0].ID, evs[0]); err != nil {
		t.Fatal(err)
	}
	if err := events.Publish(ctx, e.js, evs[0].NATSSubject(), evs[0].ID+"-late", evs[0]); err != nil {
		t.Fatal(err)
	}
	count := func() uint64 {
		return e.count("SELECT count() FROM %s.overrides WHERE override_id = 'ov1' AND event_id LIKE '" + e.stream + "-%%'")
	}
	// atLeast is the condition that overrides holds want rows; the tests then wait 300ms more,
	// for a duplicate that would arrive meanwhile.
	atLeast := func(want uint64) func() error {
		return func() error {
			if n := count(); n < want {
				return fmt.Errorf("overrides holds %d rows, want %d", n, want)
			}
			return nil
		}
	}
	poll.Until(t, 30*time.Second, "3 override rows", atLeast(3))
	time.Sleep(300 * time.Millisecond)
	if got := count(); got != 3 {
		t.Fatalf("overrides holds %d rows, want 3", got)
	}
	if got := a.Stats().EventsStored; got != 3 {
		t.Errorf("stats: %d events stored, want 3", got)
	}
	// Redelivery of the whole stream: a new consumer of the same name.
	stop()
	if err := e.js.DeleteConsumer(ctx, events.Stream, cfg.EventsConsumer); err != nil {
		t.Fatal(err)
	}
	cfg.InstanceID = "events-again"
	b, _ := e.startWith(cfg)
	evs[2].ID += "-new"
	if err := events.Publish(ctx, e.js, evs[2].NATSSubject(), evs[2].ID, evs[2]); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the redelivered override row", atLeast(4))
	time.Sleep(300 * time.Millisecond)
	if got := count(); got != 4 {
		t.Errorf("after redelivery overrides holds %d rows, want 4", got)
	}
	if got := b.Stats().EventsStored; got != 1 {
		t.Errorf("second aggregator stored %d events, want only the new one", got)
	}
	var reason, target, action string
	var mult float64
	row := e.ch.QueryRow(ctx, fmt.Sprintf("SELECT reason, target, action, multiplier FROM %s.overrides WHERE event_id = '%s'", e.db, evs[0].ID))
	if err := row.Scan(&reason, &target, &action, &mult); err != nil {
		t.Fatal(err)
	}
	if reason != "launch day" || target != "subject" || action != "created" || mult != 2 {
		t.Errorf("stored override: reason %q, target %q, action %q, multiplier %v", reason, target, action, mult)
	}
}
