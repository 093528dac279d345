package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

const adminTestRules = `default_tier: free
tiers: {free: {}, premium: {}}
users:
  custom: {limits: {orders: 3}}
rules:
- {id: orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 10, window: 1h}
- {id: orders-premium, dimension: user, endpoint: /orders, tier: premium, algorithm: fixed_window, limit: 50, window: 1h}
`

// testToken is an admin token unique to one test run: the admin API's rate-limit buckets
// outlive a test in the shared Redis.
func testToken() string { return "cmd-test-token-" + time.Now().Format("150405.000000000") }

// ownNATS starts a NATS server for one test: the rule store's buckets have fixed names, and
// the package's shared server holds the pipeline tests' rules.
func ownNATS(t *testing.T) *natstest.Server {
	t.Helper()
	ns, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	return ns
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writer is a config's one admin token, with write access.
func writer(token string) admin.Config {
	return admin.Config{Tokens: map[string]admin.Token{token: {Name: "admin", Role: admin.RoleWrite}}}
}

// redisOf returns a client of the Redis cfg names, for a checker to own.
func redisOf(t *testing.T, cfg bucket.RedisConfig) redis.UniversalClient {
	t.Helper()
	rdb, err := bucket.NewRedisClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rdb
}

// redisDB returns a client of database db of the package's Redis, for a checker to own.
func redisDB(t *testing.T, db int) redis.UniversalClient {
	return redisOf(t, bucket.RedisConfig{URL: redisSrv.URL(db)})
}

func peekLimit(t *testing.T, client quotaflowv1connect.RateLimiterClient, user, endpoint string) int64 {
	t.Helper()
	resp, err := client.GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint}))
	if err != nil {
		t.Error(err)
		return -1
	}
	return resp.Msg.Limit
}

// TestAdminCLI runs the rules, override and tier commands against a checker.
func TestAdminCLI(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	adminTestToken := testToken()
	base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", adminTestRules),
		Redis: redisDB(t, 7), NATSURL: ns.URL, Admin: writer(adminTestToken)}).URL()
	envs := map[string]string{"QUOTAFLOW_TARGET": base, "QUOTAFLOW_ADMIN_TOKEN": adminTestToken}
	user := "cli-" + time.Now().Format("150405.000000")
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, base)

	steps := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		want     []string // in stdout+stderr
	}{
		{"list", []string{"rules", "list"}, envs, 0, []string{"ID", "orders-premium", "premium", "fixed_window", "1h"}},
		{"list json", []string{"rules", "list", "--json"}, envs, 0, []string{`"default_tier": "free"`}},
		{"get", []string{"rules", "get", "orders"}, envs, 0, []string{"id: orders", "limit: 10", "window: 1h"}},
		{"get missing", []string{"rules", "get", "nope"}, envs, 1, []string{`no rule has id "nope"`, "404"}},
		{"get needs an id", []string{"rules", "get"}, envs, 2, []string{"want a rule id"}},
		{"no token", []string{"rules", "list"}, map[string]string{"QUOTAFLOW_TARGET": base}, 2, []string{"--token"}},
		{"wrong token", []string{"rules", "list", "--token", "nope"}, envs, 1, []string{"unknown admin token", "401"}},
		{"apply invalid", []string{"rules", "apply", "-f", writeFile(t, "bad.yaml", "rules:\n- {id: a, dimension: users, endpoint: /a, algorithm: gcra, limit: 1, window: 1s}\n")},
			envs, 1, []string{"refused, nothing was changed", `dimension: unknown dimension "users"`}},
		{"delete named by a user", []string{"rules", "delete", "orders"}, envs, 1, []string{"custom", "orders"}},
		{"tier set", []string{"tier", "set", user, "premium"}, envs, 0, []string{"user " + user + " is on tier premium"}},
		{"tier set unknown", []string{"tier", "set", user, "gold"}, envs, 1, []string{"field tier", `"gold" is not a configured tier`}},
		{"override needs a target", []string{"override", "set", "--limit", "5", "--duration", "1m", "--reason", "x"}, envs, 2, []string{"name a target"}},
		{"override bad field", []string{"override", "set", "--user", user, "--rule", "nope", "--limit", "5", "--duration", "1m", "--reason", "x"}, envs, 1, []string{"field rule_id"}},
		{"override set", []string{"override", "set", "--user", user, "--rule", "orders-premium", "--limit", "70", "--duration", "10m", "--reason", "launch", "--id", "cli-ovr"},
			envs, 0, []string{"override cli-ovr: user:" + user + " rule:orders-premium limit=70 until"}},
		{"tier override", []string{"override", "set", "--tier", "free", "--multiplier", "0.5", "--duration", "10m", "--reason", "load"}, envs, 0, []string{"tier:free limit×0.5"}},
		{"override list", []string{"override", "list"}, envs, 0, []string{"cli-ovr", "limit=70", "admin", "launch", "tier:free"}},
		{"unknown verb", []string{"override", "frob"}, envs, 2, []string{`unknown verb "frob"`}},
		{"exemption needs a subject", []string{"exemption", "set", "ops", "--reason", "x"}, envs, 2, []string{"name one subject"}},
		{"exemption of an unknown rule", []string{"exemption", "set", "ops", "--ip", "10.0.0.0/8", "--rules", "nope", "--reason", "x"}, envs, 1, []string{`no rule has id "nope"`}},
		{"exemption set", []string{"exemption", "set", "ops", "--ip", "10.0.0.0/8", "--rules", "orders", "--reason", "office"}, envs, 0, []string{"ops", "ip:10.0.0.0/8", "orders", "office"}},
		{"exemption of a tenant", []string{"exemption", "set", "acme", "--dimension", "tenant", "--value", "acme", "--reason", "partner"}, envs, 0, []string{"acme", "tenant:acme", "all"}},
		{"exemption list", []string{"exemption", "list"}, envs, 0, []string{"ops", "acme", "partner"}},
		{"exemption delete", []string{"exemption", "delete", "acme"}, envs, 0, []string{"deleted exemption acme"}},
		{"check naming a tier without a token", []string{"check", "--user", user + "-t", "--endpoint", "/orders", "--tier", "premium"}, envs, 1,
			[]string{"permission_denied", "tier", "assert-tier"}},
		{"check naming a tier with an admin token", []string{"check", "--user", user + "-t", "--endpoint", "/orders", "--tier", "premium", "--token", adminTestToken}, envs, 0,
			[]string{"ALLOWED", "tier=premium"}},
	}
	for _, st := range steps {
		stdout, stderr, code := runCmd(context.Background(), st.args, st.env)
		if code != st.wantCode || slices.ContainsFunc(st.want, func(w string) bool { return !strings.Contains(stdout+stderr, w) }) {
			t.Errorf("%s: quotaflow %v: exit %d, output %q; want exit %d and %q", st.name, st.args, code, stdout+stderr, st.wantCode, st.want)
		}
	}
	// The override reaches the checker.
	deadline := time.Now().Add(5 * time.Second)
	for peekLimit(t, client, user, "/orders") != 70 {
		if time.Now().After(deadline) {
			t.Fatalf("override set through the CLI not enforced within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if stdout, stderr, code := runCmd(context.Background(), []string{"override", "delete", "cli-ovr"}, envs); code != 0 || !strings.Contains(stdout, "deleted override cli-ovr") {
		t.Errorf("override delete: exit %d, output %q", code, stdout+stderr)
	}
	// A valid file replaces everything it is told to: without --prune the rules it lacks are
	// listed and nothing changes; --dry-run prints the changes and makes none; with --prune its
	// single rule is enforced, the others are gone.
	applied := writeFile(t, "new.yaml", "rules:\n- {id: only, dimension: user, endpoint: '*', algorithm: gcra, limit: 9, window: 1m}\n")
	if stdout, stderr, code := runCmd(context.Background(), []string{"rules", "apply", "-f", applied}, envs); code != 1 ||
		!strings.Contains(stdout, "- rule orders") || !strings.Contains(stderr, "--prune") {
		t.Fatalf("rules apply of a file lacking rules: exit %d, output %q; want refused, naming rule orders and --prune", code, stdout+stderr)
	}
	if stdout, stderr, code := runCmd(context.Background(), []string{"rules", "apply", "--prune", "--dry-run", "-f", applied}, envs); code != 0 ||
		!strings.Contains(stdout, "+ rule only") || !strings.Contains(stdout, "- rule orders") || !strings.Contains(stdout, "dry run, nothing changed") {
		t.Fatalf("rules apply --dry-run: exit %d, output %q", code, stdout+stderr)
	}
	if stdout, _, _ := runCmd(context.Background(), []string{"rules", "list"}, envs); !strings.Contains(stdout, "orders") {
		t.Fatalf("rules list after the refused apply and the dry run = %q, want rule orders kept", stdout)
	}
	if stdout, stderr, code := runCmd(context.Background(), []string{"rules", "apply", "--prune", "-f", applied}, envs); code != 0 || !strings.Contains(stdout, "1 rules, 0 users") {
		t.Fatalf("rules apply --prune: exit %d, output %q", code, stdout+stderr)
	}
	if stdout, _, _ := runCmd(context.Background(), []string{"rules", "list"}, envs); !strings.Contains(stdout, "only") || strings.Contains(stdout, "orders") {
		t.Errorf("rules list after apply = %q, want only rule \"only\"", stdout)
	}
	if stdout, stderr, code := runCmd(context.Background(), []string{"rules", "delete", "only"}, envs); code != 1 || !strings.Contains(stdout+stderr, "at least one rule") {
		t.Errorf("deleting the last rule: exit %d, output %q; want it refused", code, stdout+stderr)
	}
}

func TestAdminTokensFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, file string
		flagToken  string
		wantErr    string
		wantTokens int
	}{
		{"list", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, name: ops, role: write}\n- {token: bbbbbbbbbbbbbbbb2, name: dash, role: read}\n", "", "", 2},
		{"map", "tokens:\n  aaaaaaaaaaaaaaaa1: {name: ops, role: write}\n", "cccccccccccccccc", "", 2},
		{"bad role", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, name: ops, role: admin}\n", "", `tokens[0].role: want read or write, got "admin"`, 0},
		{"no name", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, role: read}\n", "", "tokens[0].name: required", 0},
		{"short token", "tokens:\n- {token: short, name: x, role: read}\n", "", "tokens[0].token: want at least 16 characters", 0},
		{"twice", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, name: a, role: read}\n- {token: aaaaaaaaaaaaaaaa1, name: b, role: read}\n", "", "tokens[1].token: listed twice", 0},
		{"unknown key", "tokns: []\n", "", "field tokns not found", 0},
		{"same as flag", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, name: a, role: read}\n", "aaaaaaaaaaaaaaaa1", "--admin-token: the same token", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tokens, err := admin.LoadTokens(writeFile(t, "tokens.yaml", tt.file), tt.flagToken)
			err = cli.FlagError(err, checkerFlagNames)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("LoadTokens: %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("LoadTokens: %v, want an error with %q", err, tt.wantErr)
			case tt.wantErr == "" && len(tokens) != tt.wantTokens:
				t.Errorf("got %d tokens, want %d", len(tokens), tt.wantTokens)
			}
		})
	}
	// A bad file stops the checker at start, naming the flag and the field.
	bad := writeFile(t, "bad.yaml", "tokens:\n- {token: aaaaaaaaaaaaaaaa1, name: ops, role: owner}\n")
	_, stderr, code := runCmd(context.Background(), []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--admin-tokens-file", bad}, nil)
	if code != 2 || !strings.Contains(stderr, "--admin-tokens-file") || !strings.Contains(stderr, "tokens[0].role") {
		t.Errorf("checker with a bad tokens file: exit %d, stderr %q; want 2 naming the flag and tokens[0].role", code, stderr)
	}
}

// TestCheckerStoreUnreachableAtStart: a checker whose NATS is down at start enforces its rules
// file, then switches to the rule store's rules once NATS answers.
func TestCheckerStoreUnreachableAtStart(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	// The store is seeded with other rules (limit 7) than the checker's file (limit 3).
	store := writeFile(t, "store.yaml", "rules:\n- {id: r, dimension: user, endpoint: /r, algorithm: fixed_window, limit: 7, window: 1h}\n")
	file := writeFile(t, "file.yaml", "rules:\n- {id: r, dimension: user, endpoint: /r, algorithm: fixed_window, limit: 3, window: 1h}\n")
	daemontest.Checker(t, daemon.CheckerConfig{RulesFile: store, Redis: redisDB(t, 7), NATSURL: ns.URL})
	ns.Stop()
	base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: file, Redis: redisDB(t, 7), NATSURL: ns.URL}).URL()
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, base)
	if got := peekLimit(t, client, "u", "/r"); got != 3 {
		t.Fatalf("limit with NATS down at start = %d, want the file's 3", got)
	}
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for peekLimit(t, client, "u", "/r") != 7 {
		if time.Now().After(deadline) {
			t.Fatal("the checker did not switch to the rule store's rules within 20s of NATS coming back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOverridePropagation writes overrides through the admin API of one of three checker
// processes and measures, per write, the time until all three enforce it. Only correctness is
// asserted (all within 5s); the figures are logged.
func TestOverridePropagation(t *testing.T) {
	t.Parallel()
	const samples = 30
	ns := ownNATS(t)
	adminTestToken := testToken()
	rules := writeFile(t, "rules.yaml", adminTestRules)
	var urls []string
	var clients []quotaflowv1connect.RateLimiterClient
	for i := 0; i < 3; i++ {
		p := startCheckerProcess(t, "--rules", rules, "--redis-url", redisSrv.URL(7), "--nats-url", ns.URL,
			"--spool-dir", t.TempDir(), "--admin-token", adminTestToken, "--admin-write-per-minute", "100000")
		urls = append(urls, p.url)
		clients = append(clients, quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, p.url))
	}
	user := "prop-" + time.Now().Format("150405.000000")
	var all, writes []time.Duration
	for i := 0; i < samples; i++ {
		limit := int64(100 + i)
		body, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("prop-%d", i), "rule_id": "orders", "limit": limit, "duration": "10m", "reason": "propagation test"})
		req, _ := http.NewRequest("POST", urls[i%3]+"/api/v1/users/"+user+"/override", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminTestToken)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("sample %d: POST override = %d", i, resp.StatusCode)
		}
		writes = append(writes, time.Since(start))
		var wg sync.WaitGroup
		seen := make([]time.Duration, len(clients))
		for j, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for peekLimit(t, c, user, "/orders") != limit {
					if time.Since(start) > 5*time.Second {
						t.Errorf("sample %d: checker %d not enforcing limit %d within 5s", i, j, limit)
						return
					}
					time.Sleep(time.Millisecond)
				}
				seen[j] = time.Since(start)
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		all = append(all, slices.Max(seen))
		// The next sample's override is newer and wins; removing this one keeps the set small.
		del, _ := http.NewRequest("DELETE", urls[0]+"/api/v1/overrides/"+fmt.Sprintf("prop-%d", i), nil)
		del.Header.Set("Authorization", "Bearer "+adminTestToken)
		if resp, err := http.DefaultClient.Do(del); err == nil {
			resp.Body.Close()
		}
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	t.Logf("override write → all 3 checkers enforcing (%d samples, from the API request's start): p50 %v, p99 %v, max %v",
		samples, pct(all, 0.5), pct(all, 0.99), slices.Max(all))
	t.Logf("API write alone (store validated, KV put, event published): p50 %v, p99 %v, max %v",
		pct(writes, 0.5), pct(writes, 0.99), slices.Max(writes))
}
