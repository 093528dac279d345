package admin

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

// TestAdminAudit: every write through the API is an event on the events stream naming the
// calling token's name, and a refused write is none.
func TestAdminAudit(t *testing.T) {
	t.Parallel()
	// newAdminEnv's setup, keeping the JetStream context to read the events stream.
	store, js := rulestoretest.Seeded(t, adminRules)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set, err := store.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const ciToken = "test-ci-write-token"
	env := newEnv(t, checker.Config{Rules: set}, Config{RuleStore: store, ReadPerMinute: 1e6, WritePerMinute: 1e6,
		Tokens: map[string]Token{writeToken: {"alice-ops", RoleWrite}, ciToken: {"ci-pipeline", RoleWrite}}})

	rule := `{"id":"reports","dimension":"user","endpoint":"/reports","algorithm":"fixed_window","limit":1,"window":"1h"}`
	tests := []struct {
		name, method, path, token string
		body                      any
		wantStatus                int
		// wantSubject, wantActor and wantTarget describe the event; no subject: none.
		wantSubject, wantActor, wantTarget string
	}{
		{"create a rule", "POST", "/api/v1/rules", writeToken, rule, 201, "quotaflow.config.rule_created", "alice-ops", "reports"},
		{"create it again", "POST", "/api/v1/rules", writeToken, rule, 409, "", "", ""},
		{"replace it", "PUT", "/api/v1/rules/reports", ciToken, `{"dimension":"user","endpoint":"/reports","algorithm":"fixed_window","limit":3,"window":"1h"}`,
			200, "quotaflow.config.rule_replaced", "ci-pipeline", "reports"},
		{"put a new rule", "PUT", "/api/v1/rules/exports", writeToken, `{"dimension":"user","endpoint":"/exports","algorithm":"gcra","limit":3,"window":"1m"}`,
			201, "quotaflow.config.rule_created", "alice-ops", "exports"},
		{"delete it", "DELETE", "/api/v1/rules/exports", ciToken, nil, 204, "quotaflow.config.rule_deleted", "ci-pipeline", "exports"},
		{"delete a missing rule", "DELETE", "/api/v1/rules/nope", ciToken, nil, 404, "", "", ""},
		{"set a tier", "PUT", "/api/v1/users/bob/tier", writeToken, `{"tier":"premium"}`, 200, "quotaflow.config.user_tier_set", "alice-ops", "bob"},
		{"set an unknown tier", "PUT", "/api/v1/users/bob/tier", writeToken, `{"tier":"gold"}`, 400, "", "", ""},
		{"override a user", "POST", "/api/v1/users/bob/override", ciToken, `{"id":"ov-bob","multiplier":2,"duration":"1h","reason":"launch"}`,
			201, "quotaflow.overrides.created", "ci-pipeline", "ov-bob"},
		{"delete the override", "DELETE", "/api/v1/overrides/ov-bob", writeToken, nil, 204, "quotaflow.overrides.deleted", "alice-ops", "ov-bob"},
		{"exempt a network", "PUT", "/api/v1/exemptions/office", writeToken, `{"dimension":"ip","value":"10.0.0.0/8","reason":"office NAT"}`,
			201, "quotaflow.config.exemption_set", "alice-ops", "office"},
		{"exempt from an unknown rule", "PUT", "/api/v1/exemptions/bad", writeToken, `{"dimension":"user","value":"u","rules":["nope"]}`, 400, "", "", ""},
		{"replace the exemption", "PUT", "/api/v1/exemptions/office", ciToken, `{"dimension":"ip","value":"10.1.0.0/16"}`,
			200, "quotaflow.config.exemption_set", "ci-pipeline", "office"},
		{"delete the exemption", "DELETE", "/api/v1/exemptions/office", writeToken, nil, 204, "quotaflow.config.exemption_deleted", "alice-ops", "office"},
		{"delete a missing exemption", "DELETE", "/api/v1/exemptions/office", writeToken, nil, 404, "", "", ""},
		{"apply a document lacking rules, not pruning", "PUT", "/api/v1/rules", ciToken, `{"default_tier":"free","tiers":{"free":{}},"rules":[{"id":"only","dimension":"user","endpoint":"*","algorithm":"gcra","limit":7,"window":"1m"}]}`,
			409, "", "", ""},
		{"apply a document", "PUT", "/api/v1/rules?prune=true", ciToken, `{"default_tier":"free","tiers":{"free":{}},"rules":[{"id":"only","dimension":"user","endpoint":"*","algorithm":"gcra","limit":7,"window":"1m"}]}`,
			200, "quotaflow.config.rules_applied", "ci-pipeline", ""},
		{"apply an invalid document", "PUT", "/api/v1/rules", ciToken, `{"rules":[]}`, 400, "", "", ""},
	}
	seen := len(readEvents(t, js)) // the seeding's
	for _, tt := range tests {
		got := env.call(t, tt.method, tt.path, tt.token, tt.body)
		if got.status != tt.wantStatus {
			t.Fatalf("%s: %s %s = %d %s, want %d", tt.name, tt.method, tt.path, got.status, got.raw, tt.wantStatus)
		}
		all := readEvents(t, js)
		fresh := all[seen:]
		seen = len(all)
		if tt.wantSubject == "" {
			if len(fresh) != 0 {
				t.Errorf("%s (refused): events %+v, want none", tt.name, fresh)
			}
			continue
		}
		if len(fresh) != 1 {
			t.Errorf("%s: %d events %+v, want one", tt.name, len(fresh), fresh)
			continue
		}
		if ev := fresh[0]; ev.subject != tt.wantSubject || ev.actor != tt.wantActor || ev.target != tt.wantTarget {
			t.Errorf("%s: event %+v, want %s by %s on %q", tt.name, ev, tt.wantSubject, tt.wantActor, tt.wantTarget)
		}
	}
}

// auditEvent is what TestAdminAudit reads of an event: its subject, actor and target.
type auditEvent struct{ subject, actor, target string }

// readEvents returns the config and override events of the events stream, oldest first.
func readEvents(t *testing.T, js jetstream.JetStream) []auditEvent {
	t.Helper()
	var out []auditEvent
	for _, m := range natstest.Messages(t, js, events.Stream, events.ConfigPrefix+".>", events.OverridesPrefix+".>") {
		ev := auditEvent{subject: m.Subject()}
		if kind, _ := events.Kind(m.Subject()); kind == "config" {
			var ce events.ConfigEvent
			if err := json.Unmarshal(m.Data(), &ce); err != nil {
				t.Fatal(err)
			}
			ev.actor, ev.target = ce.Actor, ce.Target()
		} else {
			var oe events.OverrideEvent
			if err := json.Unmarshal(m.Data(), &oe); err != nil {
				t.Fatal(err)
			}
			ev.actor, ev.target = oe.Actor, oe.Override.ID
		}
		out = append(out, ev)
	}
	return out
}
