package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// fuzzAdminRoutes are the writes FuzzAdminBodies sends its bodies to, chosen by the selector
// byte: the endpoints that decode a JSON body into the configuration.
var fuzzAdminRoutes = [...]struct{ method, path string }{
	{http.MethodPut, "/api/v1/rules"},
	{http.MethodPost, "/api/v1/rules"},
	{http.MethodPost, "/api/v1/overrides"},
	{http.MethodPut, "/api/v1/users/fuzz-user/tier"},
}

// fuzzAdminEnv is newAdminEnv for a fuzz target, which has no *testing.T: the admin API of a
// checker whose rules follow a rule store on a NATS server of its own (one per fuzz worker
// process), seeded with adminRules.
type fuzzAdminEnv struct {
	api  http.Handler
	seed []byte // adminRules as a PUT /api/v1/rules body
}

func newFuzzAdminEnv(f *testing.F) *fuzzAdminEnv {
	f.Helper()
	ctx := context.Background()
	store, err := rulestore.Open(ctx, natstest.JetStream(f), rulestore.Config{})
	if err != nil {
		f.Fatal(err)
	}
	doc, err := rules.Decode([]byte(adminRules))
	if err != nil {
		f.Fatal(err)
	}
	seed, err := json.Marshal(doc)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := store.Seed(ctx, doc); err != nil {
		f.Fatal(err)
	}
	set, err := store.Current(ctx)
	if err != nil {
		f.Fatal(err)
	}
	cfg := Config{RuleStore: store, ReadPerMinute: 1e6, WritePerMinute: 1e6,
		Tokens: map[string]Token{writeToken: {"alice-ops", RoleWrite}}}
	env := newEnv(f, checker.Config{Rules: set, RedisTimeout: 200 * time.Millisecond}, cfg)

	// The checker follows the store as in production, so that a document the store accepts
	// also goes through the engine's side. Its error is reported once the target is done: a
	// fuzz target's F must not be failed while inputs run.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- store.Watch(wctx, env.engine.SetRules) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && wctx.Err() == nil {
			f.Errorf("watch: %v", err)
		}
	})

	// The API is called in the test's goroutine rather than over env's loopback port, where
	// net/http would recover a panic and the target would only see a closed connection.
	cfg.Logger = checkertest.Logger()
	return &fuzzAdminEnv{api: New(env.engine, cfg).Handler(), seed: seed}
}

// call serves one request with the write token.
func (e *fuzzAdminEnv) call(method, path string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+writeToken)
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	e.api.ServeHTTP(w, r)
	return w
}

// restore undoes a write that route accepted (answering body), through the API, so that every
// input starts from the configuration newFuzzAdminEnv seeded: a failure then replays from its
// input alone, and accepted overrides do not pile up and slow every later read.
func (e *fuzzAdminEnv) restore(t *testing.T, route int, body []byte) {
	t.Helper()
	method, path, req := http.MethodPut, "/api/v1/rules?prune=true", e.seed
	if route == 2 {
		var o struct{ ID string }
		if err := json.Unmarshal(body, &o); err != nil || o.ID == "" {
			t.Fatalf("created override without an id: %q", body)
		}
		method, path, req = http.MethodDelete, "/api/v1/overrides/"+url.PathEscape(o.ID), nil
	}
	if w := e.call(method, path, req); w.Code >= 300 {
		t.Fatalf("restore: %s %s = %d %s", method, path, w.Code, w.Body.Bytes())
	}
}

func FuzzAdminBodies(f *testing.F) {
	// Valid writes of each route, then the refused bodies of TestAdminRuleChanges,
	// TestAdminOverrideBodies and TestAdminRateLimit.
	for _, s := range []struct {
		route int
		body  string
	}{
		{0, `{"default_tier":"free","tiers":{"free":{}},"rules":[{"id":"only","dimension":"user","endpoint":"*","algorithm":"gcra","limit":7,"window":"1m"}]}`},
		{0, `{"default_tier":"free","tiers":{"free":{},"gold":{}},"users":{"u1":{"tier":"gold","limits":{"r":3}}},` +
			`"rules":[{"id":"r","dimension":"user","endpoint":"/x/*","algorithm":"token_bucket","limit":5,"window":"1h","burst":9,"fail_mode":"local"},` +
			`{"id":"s","dimension":"ip","endpoint":"*","tier":"gold","algorithm":"sliding_window_counter","limit":5,"window":"1500ms","shadow":true}]}`},
		{0, `{"rules":[]}`},
		{0, `{"rules":[],"extra":1}`},
		{1, `{"id":"reports","dimension":"user","endpoint":"/reports","algorithm":"fixed_window","limit":1,"window":"1h"}`},
		{1, `{"id":"new","dimension":"user","endpoint":"/x","algorithm":"bogus","limit":5,"window":"1m"}`},
		{1, `{"id":"orders","dimension":"user","endpoint":"/x","algorithm":"gcra","limit":5,"window":"1m"}`},
		{1, `{"id":"orders2","dimension":"user","endpoint":"/orders","algorithm":"fixed_window","limit":5,"window":"1h"}`},
		{1, `{"id":"w","dimension":"user","endpoint":"/w","algorithm":"sliding_window_log","limit":9223372036854775807,"window":"1ns"}`},
		{1, `{"dimension":"user","endpoint":"/orders","algorithm":"fixed_window","limit":-5,"window":"1h"}`},
		{2, `{"tier":"free","multiplier":2,"duration":"1m","reason":"r"}`},
		{2, `{"dimension":"user","identifier":"u1","rule_id":"orders","limit":20,"duration":"1m","reason":"r","id":"ovr-1"}`},
		{2, `{"rule_id":"search","multiplier":0.5,"duration":"1h","reason":"r"}`},
		{2, `{"rule_id":"orders","limit":20,"duration":"soon","reason":"r"}`},
		{2, `{"rule_id":"orders","limit":20,"duration":"-1m","reason":"r"}`},
		{2, `{"rule_id":"orders","limit":20,"multiplier":2,"duration":"1m","reason":"r"}`},
		{2, `{"rule_id":"ip-all","limit":20,"duration":"1m","reason":"r","dimension":"user","identifier":"u"}`},
		{2, `{"id":"-x","rule_id":"orders","limit":20,"duration":"1m","reason":"r"}`},
		{2, `{"tier":"gold","multiplier":2,"duration":"1m","reason":"r"}`},
		{2, `{"dimension":"global","identifier":"x","limit":5,"duration":"1m","reason":"r"}`},
		{2, `{"limit":5,"duration":"1m","reason":"r"}`},
		{2, `{"tier":"free","multiplier":2,"duration":"9000h","reason":"r"}`},
		{2, `{"tier":"free","multiplier":1e308,"duration":"2562047h47m16.854775807s","reason":"r"}`},
		{3, `{"tier":"premium"}`},
		{3, `{"tier":"gold"}`},
		{3, `{"tier":null}`},
		{3, `{"rule_id":`},
		{3, ``},
		{3, `{} {}`},
		{3, `{"tier":"free"} x`},
	} {
		f.Add(byte(s.route), []byte(s.body))
	}
	env := newFuzzAdminEnv(f)
	f.Fuzz(func(t *testing.T, sel byte, body []byte) {
		route := int(sel) % len(fuzzAdminRoutes)
		rt := fuzzAdminRoutes[route]
		w := env.call(rt.method, rt.path, body)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: HTTP %d %s", rt.method, rt.path, body, w.Code, w.Body.Bytes())
		}
		if w.Code < 300 {
			env.restore(t, route, w.Body.Bytes())
		}
	})
}
