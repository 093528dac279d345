package rulestore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// TestConfigEvents: every accepted write publishes exactly one config event naming its actor,
// its action and target, what it wrote and when; a refused write publishes none. The seeding
// is recorded once, by seedActor.
func TestConfigEvents(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, js := newStore(t)
	for range 2 {
		if _, err := s.Seed(ctx, mustDecode(t, doc)); err != nil {
			t.Fatal(err)
		}
	}
	seen := readConfigEvents(t, js)
	if len(seen) != 1 || seen[0].Action != events.ConfigRulesSeeded || seen[0].Actor != seedActor {
		t.Fatalf("after seeding twice: events %+v, want one rules_seeded by %q", seen, seedActor)
	}

	ipMin := rules.DocRule{ID: "ip-min", Dimension: "ip", Endpoint: "*", Algorithm: "fixed_window", Limit: "100", Window: "1m"}
	ipMin2 := ipMin
	ipMin2.Limit = "200"
	ipHour := rules.DocRule{ID: "ip-hour", Dimension: "ip", Endpoint: "*", Algorithm: "fixed_window", Limit: "1000", Window: "1h"}
	applied := mustDecode(t, "default_tier: free\ntiers: {free: {}}\nrules:\n  - {id: only, dimension: ip, endpoint: \"*\", algorithm: gcra, limit: 1, window: 1s}\n")
	tests := []struct {
		name  string
		write func() error
		// want is the event's action, actor, rule, user and tier; nil when the write is refused.
		want *events.ConfigEvent
		// wantDetail is in the event's detail.
		wantDetail string
	}{
		{"create", func() error { return s.CreateRule(ctx, ipMin, "alice") },
			&events.ConfigEvent{Action: events.ConfigRuleCreated, Actor: "alice", RuleID: "ip-min"}, `"limit":100`},
		{"create a used id", func() error { return s.CreateRule(ctx, ipMin, "alice") }, nil, ""},
		{"replace", func() error { _, err := s.PutRule(ctx, ipMin2, "bob"); return err },
			&events.ConfigEvent{Action: events.ConfigRuleReplaced, Actor: "bob", RuleID: "ip-min"}, `"limit":200`},
		{"put a new rule", func() error { _, err := s.PutRule(ctx, ipHour, "bob"); return err },
			&events.ConfigEvent{Action: events.ConfigRuleCreated, Actor: "bob", RuleID: "ip-hour"}, `"window":"1h"`},
		{"put an invalid rule", func() error {
			_, err := s.PutRule(ctx, rules.DocRule{ID: "bad", Dimension: "user", Endpoint: "*", Algorithm: "gcra", Limit: "0", Window: "1s"}, "bob")
			return err
		}, nil, ""},
		{"delete", func() error { return s.DeleteRule(ctx, "ip-hour", "carol") },
			&events.ConfigEvent{Action: events.ConfigRuleDeleted, Actor: "carol", RuleID: "ip-hour"}, `"limit":1000`},
		{"delete a missing rule", func() error { return s.DeleteRule(ctx, "nope", "carol") }, nil, ""},
		{"delete a rule a user names", func() error { return s.DeleteRule(ctx, "user-min", "carol") }, nil, ""},
		{"set a tier", func() error { return s.SetUserTier(ctx, "dave", "premium", "alice") },
			&events.ConfigEvent{Action: events.ConfigUserTierSet, Actor: "alice", UserID: "dave", Tier: "premium"}, `"tier":"premium"`},
		{"set an unknown tier", func() error { return s.SetUserTier(ctx, "dave", "gold", "alice") }, nil, ""},
		{"apply", func() error { return applyAll(ctx, s, applied, "ci") },
			&events.ConfigEvent{Action: events.ConfigRulesApplied, Actor: "ci"}, `"id":"only"`},
		{"apply an invalid document", func() error { return applyAll(ctx, s, &rules.Document{}, "ci") }, nil, ""},
	}
	ids := map[string]bool{seen[0].ID: true}
	for _, tt := range tests {
		before := time.Now().UTC()
		err := tt.write()
		if (err == nil) != (tt.want != nil) {
			t.Fatalf("%s: err = %v, want refused %v", tt.name, err, tt.want == nil)
		}
		all := readConfigEvents(t, js)
		fresh := all[len(seen):]
		seen = all
		if tt.want == nil {
			if len(fresh) != 0 {
				t.Errorf("%s (refused): published %+v, want nothing", tt.name, fresh)
			}
			continue
		}
		if len(fresh) != 1 {
			t.Errorf("%s: published %d events %+v, want one", tt.name, len(fresh), fresh)
			continue
		}
		got := fresh[0]
		if got.Action != tt.want.Action || got.Actor != tt.want.Actor || got.RuleID != tt.want.RuleID || got.UserID != tt.want.UserID || got.Tier != tt.want.Tier {
			t.Errorf("%s: event %+v, want action %s, actor %s, rule %q, user %q, tier %q", tt.name, got,
				tt.want.Action, tt.want.Actor, tt.want.RuleID, tt.want.UserID, tt.want.Tier)
		}
		if !strings.Contains(string(got.Detail), tt.wantDetail) {
			t.Errorf("%s: detail %s, want %s in it", tt.name, got.Detail, tt.wantDetail)
		}
		if got.At.Before(before.Add(-time.Second)) || got.At.After(time.Now().Add(time.Second)) {
			t.Errorf("%s: event at %v, want the write's instant (after %v)", tt.name, got.At, before)
		}
		if !strings.HasPrefix(got.ID, "config-"+got.Action+"-") || ids[got.ID] {
			t.Errorf("%s: event id %q: want config-%s-<revision>, unique", tt.name, got.ID, got.Action)
		}
		ids[got.ID] = true
	}
}

// TestConfigEventDetail: an event carries what was written as compact JSON, and a digest
// instead when that is too large for an event.
func TestConfigEventDetail(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.FixedZone("CET", 3600))
	big := &rules.Document{Users: map[string]rules.DocUser{}}
	for i := range 20000 { // about 600 KiB of JSON
		big.Users[fmt.Sprintf("user-%06d", i)] = rules.DocUser{Tier: "a-tier-with-a-long-name"}
	}
	tests := []struct {
		name       string
		detail     any
		wantDetail string // a prefix
	}{
		{"rule", rules.DocRule{ID: "r", Dimension: "ip", Endpoint: "*", Algorithm: "gcra", Limit: "5", Window: "1s"},
			`{"id":"r","dimension":"ip","endpoint":"*","algorithm":"gcra","limit":5,"window":"1s"}`},
		{"user", rules.DocUser{Tier: "premium"}, `{"tier":"premium"}`},
		{"large document", big, `{"truncated":true,"bytes":`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := configEvent(&events.ConfigEvent{Action: events.ConfigRulesApplied, Actor: "ci"}, 42, at, tt.detail)
			if err != nil {
				t.Fatal(err)
			}
			if ev.ID != "config-rules_applied-42" || !ev.At.Equal(at) || ev.At.Location() != time.UTC || ev.Actor != "ci" {
				t.Errorf("event %+v: want id config-rules_applied-42, at %v in UTC, actor ci", ev, at)
			}
			if !strings.HasPrefix(string(ev.Detail), tt.wantDetail) || len(ev.Detail) > maxDetail {
				t.Errorf("detail %.200s (%d bytes), want it to start with %s", ev.Detail, len(ev.Detail), tt.wantDetail)
			}
		})
	}
}

// readConfigEvents returns the config events on the events stream, oldest first.
func readConfigEvents(t *testing.T, js jetstream.JetStream) []events.ConfigEvent {
	t.Helper()
	var out []events.ConfigEvent
	for _, m := range natstest.Messages(t, js, events.Stream, events.ConfigPrefix+".>") {
		var ev events.ConfigEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if kind, err := events.Kind(m.Subject()); kind != "config" || err != nil || m.Subject() != ev.NATSSubject() {
			t.Errorf("config event on %s: kind %q, %v; want config, on %s", m.Subject(), kind, err, ev.NATSSubject())
		}
		out = append(out, ev)
	}
	return out
}
