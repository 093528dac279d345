package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The rule store is what the admin API writes to.
var _ RuleStore = (*rulestore.Store)(nil)

const adminRules = `
default_tier: free
tiers: {free: {}, premium: {}}
users:
  custom: {limits: {orders: 3}}
rules:
  - {id: orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 10, window: 1h}
  - {id: orders-premium, dimension: user, endpoint: /orders, tier: premium, algorithm: fixed_window, limit: 50, window: 1h}
  - {id: search, dimension: user, endpoint: /search, algorithm: token_bucket, limit: 5, window: 1m, burst: 8}
  - {id: search-shadow, dimension: user, endpoint: /search, algorithm: sliding_window_log, limit: 2, window: 1m, shadow: true}
  - {id: tiny, dimension: user, endpoint: /tiny, algorithm: sliding_window_log, limit: 2, window: 1h} # no window boundary for TestAdminOverrideExpires to cross
  - {id: ip-all, dimension: ip, endpoint: "*", algorithm: gcra, limit: 100, window: 1s}
`

// Tokens of the admin test environments.
const (
	writeToken = "test-write-token"
	readToken  = "test-read-token"
)

// newAdminEnv serves a checker whose admin API writes to a rule store in a NATS server of the
// test's own (the store's bucket names are fixed), seeded with doc, and whose rules follow the
// store as a production checker's do.
func newAdminEnv(t *testing.T, doc string, cfg Config) (*testEnv, *rulestore.Store) {
	t.Helper()
	return newAdminEnvConfig(t, doc, checker.Config{}, cfg)
}

// newAdminEnvConfig is newAdminEnv with the engine's configuration.
func newAdminEnvConfig(t *testing.T, doc string, checkerCfg checker.Config, cfg Config) (*testEnv, *rulestore.Store) {
	t.Helper()
	store, _ := rulestoretest.Seeded(t, doc)
	ctx := context.Background()
	set, err := store.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuleStore = store
	if cfg.ReadPerMinute == 0 && cfg.WritePerMinute == 0 {
		// The fixed test tokens' buckets are shared by every test of the run (and -count=N).
		cfg.ReadPerMinute, cfg.WritePerMinute = 1e6, 1e6
	}
	if cfg.AuthFailuresPerMinute == 0 {
		cfg.AuthFailuresPerMinute = 1e6 // every test calls from 127.0.0.1
	}
	if cfg.Tokens == nil {
		cfg.Tokens = map[string]Token{writeToken: {"alice-ops", RoleWrite}, readToken: {"dashboard", RoleRead}}
	}
	checkerCfg.Rules = set
	env := newEnv(t, checkerCfg, cfg)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := store.Watch(wctx, env.engine.SetRules); err != nil {
			t.Errorf("watch: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return env, store
}

// apiResp is one admin API answer.
type apiResp struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// call sends method path with body (marshalled unless a string) and token ("" for none).
func (e *testEnv) call(t *testing.T, method, path, token string, body any) apiResp {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := apiResp{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			t.Fatalf("%s %s: body %q is not a JSON object: %v", method, path, raw, err)
		}
	}
	return out
}

// quota peeks the user's remaining quota on endpoint.
func (e *testEnv) quota(t *testing.T, user, endpoint string) *quotaflowv1.GetRemainingQuotaResponse {
	t.Helper()
	resp, err := e.client("connect").GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

// check consumes one unit of the user's quota on endpoint.
func (e *testEnv) check(t *testing.T, user, endpoint string) *quotaflowv1.CheckRateLimitResponse {
	t.Helper()
	resp, err := e.client("connect").CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	noTokens, _ := newAdminEnv(t, adminRules, Config{Tokens: map[string]Token{}})
	noStore := newEnv(t, checker.Config{}, Config{Tokens: map[string]Token{writeToken: {"w", RoleWrite}}})
	override := map[string]any{"rule_id": "orders", "limit": 20, "duration": "1m", "reason": "test"}
	tests := []struct {
		name         string
		env          *testEnv
		method, path string
		token        string
		body         any
		wantStatus   int
		wantCode     string
		wantMsg      string
	}{
		{"no token", env, "GET", "/api/v1/rules", "", nil, 401, "unauthenticated", "Authorization: Bearer"},
		{"wrong token", env, "GET", "/api/v1/rules", "nope", nil, 401, "unauthenticated", "unknown admin token"},
		{"not bearer", env, "GET", "/api/v1/overrides", "", nil, 401, "unauthenticated", "Bearer"},
		{"read token writing", env, "POST", "/api/v1/users/u1/override", readToken, override, 403, "permission_denied", "read-only"},
		{"read token deleting", env, "DELETE", "/api/v1/rules/orders", readToken, nil, 403, "permission_denied", "needs a write token"},
		{"read token reading", env, "GET", "/api/v1/rules/orders", readToken, nil, 200, "", ""},
		{"write token reading", env, "GET", "/api/v1/overrides", writeToken, nil, 200, "", ""},
		{"no tokens configured", noTokens, "GET", "/api/v1/rules", writeToken, nil, 401, "unauthenticated", "start the checker with --admin-token"},
		{"no store", noStore, "GET", "/api/v1/rules", writeToken, nil, 503, "unavailable", "--nats-url"},
		{"unknown endpoint", env, "GET", "/api/v1/nothing", writeToken, nil, 404, "not_found", "no admin endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.env.call(t, tt.method, tt.path, tt.token, tt.body)
			if got.status != tt.wantStatus {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.path, got.status, got.raw, tt.wantStatus)
			}
			if tt.wantCode == "" {
				return
			}
			if got.body["error"] != tt.wantCode || !strings.Contains(got.body["message"].(string), tt.wantMsg) {
				t.Errorf("body = %s, want error %q and a message with %q", got.raw, tt.wantCode, tt.wantMsg)
			}
			if tt.wantStatus == 401 && !strings.HasPrefix(got.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate = %q, want Bearer", got.header.Get("WWW-Authenticate"))
			}
		})
	}
	if got := env.call(t, "GET", "/api/v1/rules", "", nil); got.header.Get("Authorization") != "" || strings.Contains(got.raw, writeToken) {
		t.Errorf("a 401 must not echo tokens: %s", got.raw)
	}
}

func TestAdminRateLimit(t *testing.T) {
	t.Parallel()
	// Buckets outlive the test in the shared Redis: tokens unique to this run.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	readToken, writeToken := "read-"+run, "write-"+run
	env, _ := newAdminEnv(t, adminRules, Config{ReadPerMinute: 3, WritePerMinute: 2,
		Tokens: map[string]Token{readToken: {"dashboard", RoleRead}, writeToken: {"alice-ops", RoleWrite}}})
	for i := 1; i <= 3; i++ {
		if got := env.call(t, "GET", "/api/v1/rules", readToken, nil); got.status != 200 {
			t.Fatalf("read %d = %d %s, want 200", i, got.status, got.raw)
		}
	}
	got := env.call(t, "GET", "/api/v1/overrides", readToken, nil)
	if got.status != 429 || got.body["error"] != "rate_limited" {
		t.Fatalf("read 4 = %d %s, want 429 rate_limited", got.status, got.raw)
	}
	if secs, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || secs < 1 || secs > 60 {
		t.Errorf("Retry-After = %q, want 1 to 60 seconds", got.header.Get("Retry-After"))
	}
	// Each token has its own budget, and reads and writes are counted apart.
	if got := env.call(t, "GET", "/api/v1/rules", writeToken, nil); got.status != 200 {
		t.Errorf("another token's read = %d, want 200", got.status)
	}
	tier := map[string]string{"tier": "premium"}
	for i := 1; i <= 2; i++ {
		if got := env.call(t, "PUT", "/api/v1/users/"+id(t, "u")+"/tier", writeToken, tier); got.status != 200 {
			t.Fatalf("write %d = %d %s, want 200", i, got.status, got.raw)
		}
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+id(t, "u")+"/tier", writeToken, tier); got.status != 429 || got.header.Get("Retry-After") == "" {
		t.Errorf("write 3 = %d %s (Retry-After %q), want 429 with Retry-After", got.status, got.raw, got.header.Get("Retry-After"))
	}
}

// TestAdminRateLimitWithoutRedis: while Redis is unreachable the admin API is still rate
// limited, by this process's own buckets.
func TestAdminRateLimitWithoutRedis(t *testing.T) {
	t.Parallel()
	rs, rdb := ownRedis(t)
	env, _ := newAdminEnvConfig(t, adminRules, checker.Config{Redis: rdb, RedisTimeout: 200 * time.Millisecond},
		Config{ReadPerMinute: 2, WritePerMinute: 1})
	rs.Stop()
	for i := 1; i <= 2; i++ {
		if got := env.call(t, "GET", "/api/v1/rules", readToken, nil); got.status != 200 {
			t.Fatalf("read %d with Redis down = %d %s, want 200", i, got.status, got.raw)
		}
	}
	if got := env.call(t, "GET", "/api/v1/rules", readToken, nil); got.status != 429 || got.header.Get("Retry-After") == "" {
		t.Errorf("read 3 with Redis down = %d %s, want 429 with Retry-After", got.status, got.raw)
	}
	// The user's limits still list, without remaining quotas, saying why.
	got := env.call(t, "GET", "/api/v1/users/u/limits", writeToken, nil)
	if got.status != 200 || got.body["quota_error"] == nil || strings.Contains(got.raw, `"remaining"`) || strings.Contains(got.raw, `"state"`) {
		t.Errorf("limits with Redis down = %d %s, want 200 with quota_error and no remaining or state", got.status, got.raw)
	}
}

func TestAdminOverrideBodies(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	tests := []struct {
		name, path string
		body       any
		wantField  string
	}{
		{"bad duration", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"duration":"soon","reason":"r"}`, "duration"},
		{"negative duration", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"duration":"-1m","reason":"r"}`, "duration"},
		{"no duration", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"reason":"r"}`, "duration"},
		{"limit and multiplier", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"multiplier":2,"duration":"1m","reason":"r"}`, "limit"},
		{"neither limit nor multiplier", "/api/v1/users/u/override", `{"rule_id":"orders","duration":"1m","reason":"r"}`, "limit"},
		{"unknown rule", "/api/v1/users/u/override", `{"rule_id":"nope","limit":20,"duration":"1m","reason":"r"}`, "rule_id"},
		{"rule of another dimension", "/api/v1/users/u/override", `{"rule_id":"ip-all","limit":20,"duration":"1m","reason":"r"}`, "rule_id"},
		{"unknown field", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"duration":"1m","reason":"r","ttl":"1m"}`, "ttl"},
		{"limit not a number", "/api/v1/users/u/override", `{"rule_id":"orders","limit":"ten","duration":"1m","reason":"r"}`, "limit"},
		{"no reason", "/api/v1/users/u/override", `{"rule_id":"orders","limit":20,"duration":"1m"}`, "reason"},
		{"bad id", "/api/v1/users/u/override", `{"id":"-x","rule_id":"orders","limit":20,"duration":"1m","reason":"r"}`, "id"},
		{"not JSON", "/api/v1/users/u/override", `{"rule_id":`, "body"},
		{"empty", "/api/v1/users/u/override", ``, "body"},
		{"two objects", "/api/v1/users/u/override", `{} {}`, "body"},
		{"unknown tier", "/api/v1/overrides", `{"tier":"gold","multiplier":2,"duration":"1m","reason":"r"}`, "tier"},
		{"global subject", "/api/v1/overrides", `{"dimension":"global","identifier":"x","limit":5,"duration":"1m","reason":"r"}`, "dimension"},
		{"no target", "/api/v1/overrides", `{"limit":5,"duration":"1m","reason":"r"}`, "rule_id"},
		{"too long", "/api/v1/overrides", map[string]any{"tier": "free", "multiplier": 2, "duration": "9000h", "reason": "r"}, "duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := env.call(t, "POST", tt.path, writeToken, tt.body)
			if got.status != 400 || got.body["error"] != "invalid_argument" || got.body["field"] != tt.wantField {
				t.Errorf("POST %s %v = %d %s, want 400 invalid_argument naming field %q", tt.path, tt.body, got.status, got.raw, tt.wantField)
			}
		})
	}
	if got := env.call(t, "GET", "/api/v1/overrides", readToken, nil); len(got.body["overrides"].([]any)) != 0 {
		t.Errorf("overrides after refused bodies = %s, want none", got.raw)
	}
	big := `{"reason":"` + strings.Repeat("x", maxAdminBody) + `"}`
	if got := env.call(t, "POST", "/api/v1/overrides", writeToken, big); got.status != 413 || got.body["field"] != "body" {
		t.Errorf("oversized body = %d %s, want 413 naming body", got.status, got.raw)
	}
}

func TestAdminRuleChanges(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	before := env.call(t, "GET", "/api/v1/rules", readToken, nil).raw

	refused := []struct {
		name, method, path string
		body               any
		wantStatus         int
		wantField, want    string // want: in message or problems
	}{
		{"invalid rule", "POST", "/api/v1/rules", `{"id":"new","dimension":"user","endpoint":"/x","algorithm":"bogus","limit":5,"window":"1m"}`, 400, "", "algorithm"},
		{"rule exists", "POST", "/api/v1/rules", `{"id":"orders","dimension":"user","endpoint":"/x","algorithm":"gcra","limit":5,"window":"1m"}`, 409, "id", "exists"},
		{"id mismatch", "PUT", "/api/v1/rules/orders", `{"id":"other","dimension":"user","endpoint":"/orders","algorithm":"fixed_window","limit":5,"window":"1h"}`, 400, "id", "differs"},
		{"invalid replacement", "PUT", "/api/v1/rules/orders", `{"dimension":"user","endpoint":"/orders","algorithm":"fixed_window","limit":-5,"window":"1h"}`, 400, "", "limit"},
		{"duplicate bucket", "POST", "/api/v1/rules", `{"id":"orders2","dimension":"user","endpoint":"/orders","algorithm":"fixed_window","limit":5,"window":"1h"}`, 400, "", "share one bucket"},
		{"rule a user names", "DELETE", "/api/v1/rules/orders", nil, 400, "", "orders"},
		{"missing rule", "DELETE", "/api/v1/rules/nope", nil, 404, "", "nope"},
		{"invalid document", "PUT", "/api/v1/rules", `{"rules":[]}`, 400, "", "at least one rule"},
		{"unknown document field", "PUT", "/api/v1/rules", `{"rules":[],"extra":1}`, 400, "extra", "unknown field"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			got := env.call(t, tt.method, tt.path, writeToken, tt.body)
			if got.status != tt.wantStatus || got.body["field"] != nilIfEmpty(tt.wantField) || !strings.Contains(got.raw, tt.want) {
				t.Errorf("%s %s = %d %s, want %d, field %q and %q", tt.method, tt.path, got.status, got.raw, tt.wantStatus, tt.wantField, tt.want)
			}
			if tt.wantStatus == 400 && tt.wantField == "" && len(got.body["problems"].([]any)) == 0 {
				t.Errorf("refused rule change %s: no problems listed", got.raw)
			}
		})
	}
	if after := env.call(t, "GET", "/api/v1/rules", readToken, nil).raw; after != before {
		t.Fatalf("rules changed by refused writes:\nbefore %s\nafter  %s", before, after)
	}

	// An accepted change is enforced by the checker, and readable at once.
	user := id(t, "u")
	newRule := `{"id":"reports","dimension":"user","endpoint":"/reports","algorithm":"fixed_window","limit":1,"window":"1h"}`
	if got := env.call(t, "POST", "/api/v1/rules", writeToken, newRule); got.status != 201 {
		t.Fatalf("POST new rule = %d %s, want 201", got.status, got.raw)
	}
	if got := env.call(t, "GET", "/api/v1/rules/reports", readToken, nil); got.status != 200 || got.body["limit"] != float64(1) {
		t.Errorf("GET new rule = %d %s, want 200 with limit 1", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the checker enforces the new rule", poll.True(func() bool { return env.quota(t, user, "/reports").RuleId == "reports" }))
	env.check(t, user, "/reports")
	if r := env.check(t, user, "/reports"); r.Allowed {
		t.Errorf("second check of a limit-1 rule allowed")
	}
	if got := env.call(t, "PUT", "/api/v1/rules/reports", writeToken, `{"dimension":"user","endpoint":"/reports","algorithm":"fixed_window","limit":3,"window":"1h"}`); got.status != 200 {
		t.Fatalf("PUT rule = %d %s, want 200", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the raised limit is enforced", poll.True(func() bool { return env.quota(t, user, "/reports").Remaining == 2 }))
	if got := env.call(t, "DELETE", "/api/v1/rules/reports", writeToken, nil); got.status != 204 {
		t.Fatalf("DELETE rule = %d %s, want 204", got.status, got.raw)
	}
	if got := env.call(t, "GET", "/api/v1/rules/reports", readToken, nil); got.status != 404 || got.body["error"] != "not_found" {
		t.Errorf("GET deleted rule = %d %s, want 404 not_found", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the deleted rule stops applying", poll.True(func() bool { return env.quota(t, user, "/reports").RuleId == "" }))

	// The whole document is replaced by PUT /rules, removing what it lacks only when told to
	// prune: without, each item it would remove is named and nothing changes; a dry run
	// answers what would change and changes nothing.
	doc := `{"default_tier":"free","tiers":{"free":{}},"rules":[{"id":"only","dimension":"user","endpoint":"*","algorithm":"gcra","limit":7,"window":"1m"}]}`
	got := env.call(t, "PUT", "/api/v1/rules", writeToken, doc)
	if got.status != 409 || got.body["error"] != "failed_precondition" || got.body["field"] != "prune" || !strings.Contains(got.raw, `"rule orders"`) {
		t.Fatalf("PUT /rules removing rules without prune = %d %s, want 409 failed_precondition naming rule orders", got.status, got.raw)
	}
	if got := env.call(t, "PUT", "/api/v1/rules?prune=maybe", writeToken, doc); got.status != 400 || got.body["field"] != "prune" {
		t.Errorf("PUT /rules?prune=maybe = %d %s, want 400 naming prune", got.status, got.raw)
	}
	got = env.call(t, "PUT", "/api/v1/rules?prune=true&dry_run=true", writeToken, doc)
	if got.status != 200 || got.body["dry_run"] != true || !strings.Contains(got.raw, `"rule orders"`) || !strings.Contains(got.raw, `"rule only"`) {
		t.Fatalf("PUT /rules dry run = %d %s, want 200 listing rule only added and rule orders removed", got.status, got.raw)
	}
	if q := env.quota(t, user, "/orders"); q.RuleId != "orders" {
		t.Fatalf("after the dry run /orders is decided by %q, want orders still", q.RuleId)
	}
	if got := env.call(t, "PUT", "/api/v1/rules?prune=true", writeToken, doc); got.status != 200 || got.body["rules"] != float64(1) {
		t.Fatalf("PUT /rules?prune=true = %d %s, want 200 and 1 rule", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the applied document is enforced", poll.True(func() bool { return env.quota(t, user, "/anything").RuleId == "only" }))
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestAdminOverrideKeepsCounter: an override changes the next check's answer, and what the
// user consumed is kept across the change: 9 used of 10 raised to 20 leaves 11.
func TestAdminOverrideKeepsCounter(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	user := id(t, "u")
	for i := 0; i < 9; i++ {
		env.check(t, user, "/orders")
	}
	got := env.call(t, "POST", "/api/v1/users/"+user+"/override", writeToken,
		map[string]any{"rule_id": "orders", "limit": 20, "duration": "1m", "reason": "launch day"})
	if got.status != 201 || got.body["creator"] != "alice-ops" || got.body["source"] != "admin" || got.body["identifier"] != user {
		t.Fatalf("POST override = %d %s, want 201 created by alice-ops from admin for %s", got.status, got.raw, user)
	}
	poll.Until(t, 5*time.Second, "the override is enforced", poll.True(func() bool { return env.quota(t, user, "/orders").Limit == 20 }))
	if q := env.quota(t, user, "/orders"); q.Remaining != 11 {
		t.Errorf("remaining after raising 10 to 20 with 9 used = %d, want 11", q.Remaining)
	}
	for i := 0; i < 11; i++ {
		if r := env.check(t, user, "/orders"); !r.Allowed {
			t.Fatalf("check %d after the raise denied, want 11 more allowed", i+1)
		}
	}
	if r := env.check(t, user, "/orders"); r.Allowed {
		t.Errorf("check 21 allowed under an override of 20")
	}
	// Deleting the override restores the rule's limit at once, with the counter still kept.
	oid := got.body["id"].(string)
	if got := env.call(t, "DELETE", "/api/v1/overrides/"+oid, writeToken, nil); got.status != 204 {
		t.Fatalf("DELETE override = %d %s, want 204", got.status, got.raw)
	}
	if got := env.call(t, "DELETE", "/api/v1/overrides/"+oid, writeToken, nil); got.status != 404 {
		t.Errorf("DELETE deleted override = %d %s, want 404", got.status, got.raw)
	}
	poll.Until(t, 5*time.Second, "the rule's limit is back", poll.True(func() bool { return env.quota(t, user, "/orders").Limit == 10 }))
}

// TestAdminOverrideExpires: an override vanishes by itself at its expiry, from the store and
// from what the checker enforces.
func TestAdminOverrideExpires(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	user := id(t, "u")
	env.check(t, user, "/tiny")
	env.check(t, user, "/tiny")
	if r := env.check(t, user, "/tiny"); r.Allowed {
		t.Fatal("third check of a limit-2 rule allowed")
	}
	got := env.call(t, "POST", "/api/v1/overrides", writeToken,
		map[string]any{"id": "short-" + strconv.FormatInt(time.Now().UnixNano(), 36), "dimension": "user", "identifier": user,
			"rule_id": "tiny", "limit": 5, "duration": "2s", "reason": "brief"})
	if got.status != 201 {
		t.Fatalf("POST override = %d %s", got.status, got.raw)
	}
	expires, _ := time.Parse(time.RFC3339Nano, got.body["expires_at"].(string))
	poll.Until(t, 5*time.Second, "the override is enforced", poll.True(func() bool { return env.check(t, user, "/tiny").Allowed }))
	poll.Until(t, 6*time.Second, "the checker enforces the old limit after expiry", poll.True(func() bool { return env.quota(t, user, "/tiny").Limit == 2 }))
	if late := time.Since(expires); late < -50*time.Millisecond {
		t.Errorf("the override stopped applying %s before its expiry", -late)
	} else {
		t.Logf("override stopped applying %s after its expiry", late.Round(time.Millisecond))
	}
	if r := env.check(t, user, "/tiny"); r.Allowed {
		t.Errorf("check after expiry allowed, want the old limit (2, used up) to deny")
	}
	poll.Until(t, 5*time.Second, "the expired override leaves the list", poll.True(func() bool {
		return len(env.call(t, "GET", "/api/v1/overrides", readToken, nil).body["overrides"].([]any)) == 0
	}))
}

func TestAdminUserLimits(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	user := id(t, "u")
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/tier", writeToken, `{"tier":"gold"}`); got.status != 400 || got.body["field"] != "tier" {
		t.Errorf("PUT unknown tier = %d %s, want 400 naming tier", got.status, got.raw)
	}
	if got := env.call(t, "PUT", "/api/v1/users/"+user+"/tier", writeToken, `{"tier":"premium"}`); got.status != 200 {
		t.Fatalf("PUT tier = %d %s, want 200", got.status, got.raw)
	}
	tierOvr := env.call(t, "POST", "/api/v1/overrides", writeToken, `{"tier":"premium","rule_id":"search","multiplier":2,"duration":"1h","reason":"promo"}`)
	if tierOvr.status != 201 {
		t.Fatalf("POST tier override = %d %s", tierOvr.status, tierOvr.raw)
	}
	poll.Until(t, 5*time.Second, "the tier and the override are enforced", poll.True(func() bool {
		q := env.quota(t, user, "/search")
		return q.Tier == "premium" && q.Limit == 16
	}))
	env.check(t, user, "/orders")
	env.check(t, user, "/orders")

	got := env.call(t, "GET", "/api/v1/users/"+user+"/limits", readToken, nil)
	if got.status != 200 {
		t.Fatalf("GET limits = %d %s", got.status, got.raw)
	}
	var body userLimits
	if err := json.Unmarshal([]byte(got.raw), &body); err != nil {
		t.Fatal(err)
	}
	if body.Tier != "premium" || body.QuotaError != "" {
		t.Errorf("tier %q, quota error %q; want premium and none", body.Tier, body.QuotaError)
	}
	byRule := map[string]userLimit{}
	for _, l := range body.Limits {
		byRule[l.RuleID] = l
	}
	want := []struct {
		rule                 string
		base, limit, burst   int64
		remaining            int64
		shadow, hasOverrides bool
	}{
		{"orders-premium", 50, 50, 50, 48, false, false},
		{"search", 5, 10, 16, 16, false, true},
		{"search-shadow", 2, 2, 2, 2, true, false},
		{"tiny", 2, 2, 2, 2, false, false},
	}
	if len(byRule) != len(want) {
		t.Errorf("limits for %v, want %d rules (orders is replaced by orders-premium; ip-all is no user rule)", keys(byRule), len(want))
	}
	for _, w := range want {
		l, ok := byRule[w.rule]
		switch {
		case !ok:
			t.Errorf("rule %s missing from %s", w.rule, got.raw)
		case l.BaseLimit != w.base || l.Limit != w.limit || l.Burst != w.burst || l.Shadow != w.shadow:
			t.Errorf("%s: base %d limit %d burst %d shadow %v, want %d %d %d %v", w.rule, l.BaseLimit, l.Limit, l.Burst, l.Shadow, w.base, w.limit, w.burst, w.shadow)
		case l.Remaining == nil || *l.Remaining != w.remaining || l.ResetAt == nil:
			t.Errorf("%s: remaining %v reset %v, want %d and a reset time", w.rule, l.Remaining, l.ResetAt, w.remaining)
		case (len(l.Overrides) > 0) != w.hasOverrides:
			t.Errorf("%s: overrides %v, want some: %v", w.rule, l.Overrides, w.hasOverrides)
		}
	}
	// A user's custom limit shows as such.
	got = env.call(t, "GET", "/api/v1/users/custom/limits", readToken, nil)
	if !strings.Contains(got.raw, `"rule_id":"orders","dimension":"user","endpoint":"/orders","algorithm":"fixed_window","window":"1h0m0s","window_ms":3600000,"base_limit":10,"custom_limit":3,"limit":3`) {
		t.Errorf("custom user's limits = %s, want orders with custom_limit 3", got.raw)
	}
}

// TestAdminUserLimitsState: a user's limits name each one's used, remaining and warning state,
// the same as the subject's limits at the rule's endpoint name them (the console's Subject view
// reads the first for users, the second for every other subject).
func TestAdminUserLimitsState(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	// orders: a fixed window of 10 per hour; a warning past 80% used (DefaultThresholds).
	tests := []struct {
		name            string
		checks          int64
		used, remaining int64
		state           string
	}{
		{"unused", 0, 0, 10, "normal"},
		{"at the threshold", 8, 8, 2, "normal"},
		{"past the threshold", 9, 9, 1, "warning"},
		{"spent", 10, 10, 0, "throttled"},
		{"denied past it", 12, 10, 0, "throttled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			user := id(t, "state")
			for range tt.checks {
				env.check(t, user, "/orders")
			}
			got := env.call(t, "GET", "/api/v1/users/"+user+"/limits", readToken, nil)
			var body userLimits
			if err := json.Unmarshal([]byte(got.raw), &body); got.status != 200 || err != nil {
				t.Fatalf("GET user limits = %d %s (%v)", got.status, got.raw, err)
			}
			var orders *userLimit
			for i := range body.Limits {
				if body.Limits[i].RuleID == "orders" {
					orders = &body.Limits[i]
				}
			}
			if orders == nil || orders.Used == nil || orders.Remaining == nil {
				t.Fatalf("user limits %s: want orders with used and remaining", got.raw)
			}
			if *orders.Used != tt.used || *orders.Remaining != tt.remaining || orders.State != tt.state {
				t.Errorf("user limits, orders: used %d, remaining %d, state %q; want %d, %d, %q",
					*orders.Used, *orders.Remaining, orders.State, tt.used, tt.remaining, tt.state)
			}
			got = env.call(t, "GET", "/api/v1/subjects/user:"+user+"/limits?endpoint=/orders", readToken, nil)
			var subj subjectLimits
			if err := json.Unmarshal([]byte(got.raw), &subj); got.status != 200 || err != nil || len(subj.Limits) != 1 {
				t.Fatalf("GET subject limits = %d %s (%v); want orders alone", got.status, got.raw, err)
			}
			if s := subj.Limits[0]; s.Used != *orders.Used || s.Remaining != *orders.Remaining || s.State != orders.State {
				t.Errorf("subject limits, orders: used %d, remaining %d, state %q; want the user limits' %d, %d, %q",
					s.Used, s.Remaining, s.State, *orders.Used, *orders.Remaining, orders.State)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestAdminAuthLockout: past the failed authentications allowed per minute, every call from
// the address is refused with 429 before its token is looked at, the right token included, so
// a guess cannot be told right or wrong; another address is not affected.
func TestAdminAuthLockout(t *testing.T) {
	t.Parallel()
	_, rdb := ownRedis(t) // the address's bucket is the test's own
	env, _ := newAdminEnvConfig(t, adminRules, checker.Config{Redis: rdb}, Config{AuthFailuresPerMinute: 3})
	for i := range 3 {
		if got := env.call(t, "GET", "/api/v1/rules", "guess-"+strconv.Itoa(i), nil); got.status != 401 {
			t.Fatalf("failed attempt %d = %d, want 401", i+1, got.status)
		}
	}
	for _, tok := range []string{"guess-3", writeToken} {
		got := env.call(t, "GET", "/api/v1/rules", tok, nil)
		if got.status != 429 || got.body["error"] != "rate_limited" || got.header.Get("Retry-After") == "" {
			t.Errorf("call with %s after 3 failures = %d %s, want 429 rate_limited with Retry-After", tok, got.status, got.raw)
		}
	}
	// The failures of one address do not lock out another: the bucket is per source address.
	other := httptest.NewRequest("GET", "/api/v1/rules", nil)
	other.RemoteAddr = "192.0.2.7:5555"
	other.Header.Set("Authorization", "Bearer "+writeToken)
	rec := httptest.NewRecorder()
	env.admin.Handler().ServeHTTP(rec, other)
	if rec.Code != 200 {
		t.Errorf("a call from another address = %d %s, want 200", rec.Code, rec.Body)
	}
}

// TestAdminProblemsOnce: a refused rules document's problems are listed once: in the body's
// problems (the message says how many), and once in what Client's error prints.
func TestAdminProblemsOnce(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	body := `{"rules":[{"id":"a","dimension":"users","endpoint":"/a","algorithm":"gcra","limit":5,"window":"1m"},` +
		`{"id":"b","dimension":"user","endpoint":"/b","algorithm":"gcra","limit":-5,"window":"1m"}]}`
	problems := []string{"unknown dimension", "want a whole number"}
	got := env.call(t, "PUT", "/api/v1/rules", writeToken, body)
	if got.status != 400 || len(got.body["problems"].([]any)) != 2 {
		t.Fatalf("PUT /rules with two problems = %d %s, want 400 with two problems", got.status, got.raw)
	}
	for _, p := range problems {
		if n := strings.Count(got.raw, p); n != 1 {
			t.Errorf("body names %q %d times, want once:\n%s", p, n, got.raw)
		}
	}
	var doc rules.Document
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	c := &Client{BaseURL: env.url, Token: writeToken, HTTP: env.http}
	_, err := c.ApplyRules(context.Background(), &doc, rules.ApplyOptions{Prune: true})
	if err == nil {
		t.Fatal("ApplyRules of a document with two problems = nil error")
	}
	for _, p := range problems {
		if n := strings.Count(err.Error(), p); n != 1 {
			t.Errorf("Client error names %q %d times, want once:\n%s", p, n, err)
		}
	}
	if !strings.Contains(err.Error(), "2 problems") {
		t.Errorf("Client error = %q, want it to say how many problems", err)
	}
}
