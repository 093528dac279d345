package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
)

// TestGrantAndWebhookCLI runs the grant and webhook commands against a checker: a grant added,
// listed with what it has left, voided; an endpoint set (its secret printed once), listed
// masked, deleted; bad input named; deliveries without ClickHouse a clear 503.
func TestGrantAndWebhookCLI(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	token := testToken()
	cfg := daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", adminTestRules+"entitlements:\n  - {id: llm-tokens, dimension: user, period: 1mo}\n"),
		Redis: redisDB(t, 7), NATSURL: ns.URL, Admin: writer(token)}
	cfg.Admin.WebhookPolicy.AllowHosts = []string{"hooks.example.com"}
	base := daemontest.Checker(t, cfg).URL()
	envs := map[string]string{"QUOTAFLOW_TARGET": base, "QUOTAFLOW_ADMIN_TOKEN": token}
	user := "grant-cli-" + time.Now().Format("150405.000000")
	for _, st := range []struct {
		name     string
		args     []string
		wantCode int
		want     []string // in stdout+stderr
	}{
		{"add", []string{"grant", "add", "--entitlement", "llm-tokens", "--subject", user, "--amount", "1000", "--recurring", "--rollover-max", "200",
			"--reason", "pro plan", "--id", "plan"}, 0, []string{"grant plan: 1000 of llm-tokens to user:" + user, "1000 left, 0 used", "yes (rollover 0-200)", "live", "pro plan"}},
		{"add again", []string{"grant", "add", "--entitlement", "llm-tokens", "--subject", user, "--amount", "1000", "--recurring", "--rollover-max", "200",
			"--reason", "pro plan", "--id", "plan"}, 0, []string{"grant plan", "1000 left"}},
		{"add without a reason", []string{"grant", "add", "--entitlement", "llm-tokens", "--subject", user, "--amount", "5"}, 1, []string{"field reason", "required"}},
		{"add of an unknown entitlement", []string{"grant", "add", "--entitlement", "gold", "--subject", user, "--amount", "5", "--reason", "x"}, 1, []string{`no entitlement has id "gold"`}},
		{"list", []string{"grant", "list", "--entitlement", "llm-tokens", "--subject", user}, 0, []string{"GRANT", "plan", "1000"}},
		{"void", []string{"grant", "void", "--entitlement", "llm-tokens", "--subject", user, "plan"}, 0, []string{"0 left", "voided"}},
		{"void needs an id", []string{"grant", "void", "--entitlement", "llm-tokens", "--subject", user}, 2, []string{"a grant id"}},
		{"webhook set", []string{"webhook", "set", "billing", "--url", "https://hooks.example.com/quota", "--events", "entitlement.used_percent"}, 0,
			[]string{"secret whsec_", "shown once", "billing", "https://hooks.example.com/quota", "entitlement.used_percent"}},
		{"webhook set refused", []string{"webhook", "set", "local", "--url", "http://127.0.0.1:9/"}, 1, []string{"field url", "loopback"}},
		{"webhook list", []string{"webhook", "list"}, 0, []string{"billing", "whsec_…", "enabled"}},
		{"webhook deliveries without ClickHouse", []string{"webhook", "deliveries", "billing"}, 1, []string{"503", "ClickHouse"}},
		{"webhook delete", []string{"webhook", "delete", "billing"}, 0, []string{"deleted webhook endpoint billing"}},
		{"webhook list empty", []string{"webhook", "list"}, 0, []string{"no webhook endpoints"}},
	} {
		stdout, stderr, code := runCmd(context.Background(), st.args, envs)
		if code != st.wantCode || slices.ContainsFunc(st.want, func(w string) bool { return !strings.Contains(stdout+stderr, w) }) {
			t.Errorf("%s: quotaflow %v: exit %d, output %q; want exit %d and %q", st.name, st.args, code, stdout+stderr, st.wantCode, st.want)
		}
		if st.name == "webhook list" && strings.Contains(stdout, "whsec_") && strings.Count(stdout, "whsec_…") != 1 {
			t.Errorf("webhook list shows a secret: %q", stdout)
		}
	}
}
