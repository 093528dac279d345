package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// TestWebhooksThroughAPI: an endpoint set with a write token gets a secret drawn for it,
// answered once and masked after; replacing it keeps its secret; it is listed, deleted, and
// each write is a config event without the secret. A URL the policy refuses, an id that is no
// id and an unknown field are named; a read token writes nothing.
func TestWebhooksThroughAPI(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, adminRules)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hooks, err := rulestore.OpenWebhooks(ctx, js, rulestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	set, err := store.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, checker.Config{Rules: set}, Config{RuleStore: store, Webhooks: hooks, ReadPerMinute: 1e6, WritePerMinute: 1e6,
		AuthFailuresPerMinute: 1e6, Tokens: map[string]Token{writeToken: {"alice-ops", RoleWrite}, readToken: {"dashboard", RoleRead}},
		WebhookPolicy: webhook.URLPolicy{AllowHosts: []string{"hooks.internal"}}})
	seen := len(readEvents(t, js))

	made := env.call(t, "PUT", "/api/v1/webhooks/billing", writeToken, `{"url":"https://hooks.internal/quota","filter":["entitlement.used_percent"]}`)
	secret, _ := made.body["secret"].(string)
	if made.status != 201 || !strings.HasPrefix(secret, webhook.SecretPrefix) || !strings.HasSuffix(secret, strings.TrimPrefix(made.body["secret_hint"].(string), webhook.SecretPrefix+"…")) {
		t.Fatalf("PUT: %d %s, want 201 with a drawn secret", made.status, made.raw)
	}
	again := env.call(t, "PUT", "/api/v1/webhooks/billing", writeToken, `{"url":"https://hooks.internal/quota2"}`)
	if again.status != 200 || again.body["secret"] != nil {
		t.Errorf("a replace: %d %s, want 200 without the secret", again.status, again.raw)
	}
	if ep, _, err := hooks.Endpoint(ctx, "billing"); err != nil || ep.Secret.Text() != secret || ep.URL != "https://hooks.internal/quota2" {
		t.Errorf("stored %+v, %v; want the new URL and the first secret", ep, err)
	}
	list := env.call(t, "GET", "/api/v1/webhooks", readToken, nil)
	if list.status != 200 || strings.Contains(list.raw, secret) || !strings.Contains(list.raw, `"id":"billing"`) {
		t.Errorf("GET: %d %s, want billing listed with its secret masked", list.status, list.raw)
	}
	for _, tt := range []struct {
		name, path, token, body string
		status                  int
		field                   string
	}{
		{"loopback", "/api/v1/webhooks/x", writeToken, `{"url":"http://127.0.0.1:8080/"}`, 400, "url"},
		{"no https host", "/api/v1/webhooks/x", writeToken, `{"url":"ftp://hooks.internal/"}`, 400, "url"},
		{"bad id", "/api/v1/webhooks/a.b", writeToken, `{"url":"https://hooks.internal/"}`, 400, "id"},
		{"unknown field", "/api/v1/webhooks/x", writeToken, `{"url":"https://hooks.internal/","secrett":"x"}`, 400, ""},
		{"bad secret", "/api/v1/webhooks/x", writeToken, `{"url":"https://hooks.internal/","secret":"hunter2"}`, 400, "secret"},
		{"read token", "/api/v1/webhooks/x", readToken, `{"url":"https://hooks.internal/"}`, 403, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := env.call(t, "PUT", tt.path, tt.token, tt.body)
			if r.status != tt.status || (tt.field != "" && r.body["field"] != tt.field) {
				t.Errorf("got %d %s, want %d naming %q", r.status, r.raw, tt.status, tt.field)
			}
		})
	}
	if del := env.call(t, "DELETE", "/api/v1/webhooks/billing", writeToken, nil); del.status != 204 {
		t.Errorf("DELETE: %d %s", del.status, del.raw)
	}
	if del := env.call(t, "DELETE", "/api/v1/webhooks/billing", writeToken, nil); del.status != 404 {
		t.Errorf("DELETE again: %d %s, want 404", del.status, del.raw)
	}
	fresh := readEvents(t, js)[seen:]
	if len(fresh) != 3 || fresh[0].subject != "quotaflow.config.webhook_set" || fresh[2].subject != "quotaflow.config.webhook_deleted" ||
		fresh[0].actor != "alice-ops" || fresh[2].target != "billing" {
		t.Errorf("events %+v, want two webhook_set and a webhook_deleted of billing by alice-ops", fresh)
	}
	for _, m := range readEventData(t, js) {
		if strings.Contains(m, secret) {
			t.Errorf("an event carries the secret: %s", m)
		}
	}
	if r := env.call(t, "GET", "/api/v1/webhooks/billing/deliveries", readToken, nil); r.status != 503 {
		t.Errorf("deliveries without ClickHouse: %d %s, want 503", r.status, r.raw)
	}
}

// readEventData is the data of every config event on the stream.
func readEventData(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var out []string
	for _, m := range natstest.Messages(t, js, events.Stream, events.ConfigPrefix+".>") {
		out = append(out, string(m.Data()))
	}
	return out
}
