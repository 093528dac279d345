package main

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
)

const settleTestRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: tokens, dimension: user, endpoint: /gen, algorithm: token_bucket, limit: 1000, window: 24h}
  - {id: inflight, dimension: user, endpoint: /gen, algorithm: concurrency, limit: 1, window: 1m}
`

// TestSettleCLI: quotaflow check --estimate prints a reservation and a lease; quotaflow settle
// settles it once; quotaflow release frees the lease once; bad command lines name the flag.
func TestSettleCLI(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", settleTestRules),
		Redis: redisDB(t, 13), NATSURL: ns.URL}).URL()
	envs := map[string]string{"QUOTAFLOW_TARGET": base}
	user := "cli-settle-" + time.Now().Format("150405.000000")
	ctx := context.Background()

	stdout, stderr, code := runCmd(ctx, []string{"check", "--user", user, "--endpoint", "/gen", "--estimate", "400"}, envs)
	rid := regexp.MustCompile(`reservation (\S+) until`).FindStringSubmatch(stdout)
	lid := regexp.MustCompile(`lease (\S+) until`).FindStringSubmatch(stdout)
	if code != 0 || rid == nil || lid == nil || !regexp.MustCompile(`tokens\s+token_bucket\s+1000/24h\s+400\s+600`).MatchString(stdout) {
		t.Fatalf("check --estimate 400: exit %d, %q %q; want allowed, 600 left, a reservation and a lease", code, stdout, stderr)
	}
	steps := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"settle", []string{"settle", "--id", rid[1], "--actual", "1100"}, 0, []string{"settled: estimate 400, actual 1100, 0 left  OVERAGE"}},
		{"settle twice", []string{"settle", "--id", rid[1], "--actual", "1100"}, 1, []string{"failed_precondition", "already settled"}},
		{"cancel settled", []string{"settle", "--id", rid[1], "--cancel"}, 1, []string{"failed_precondition"}},
		{"settle altered", []string{"settle", "--id", "AAAA" + rid[1][4:], "--actual", "1"}, 1, []string{"permission_denied", "reservation_id"}},
		{"settle no id", []string{"settle", "--actual", "1"}, 2, []string{"--id is required"}},
		{"settle no actual", []string{"settle", "--id", rid[1]}, 2, []string{"--actual"}},
		{"settle both", []string{"settle", "--id", rid[1], "--actual", "1", "--cancel"}, 2, []string{"--cancel"}},
		{"check busy", []string{"check", "--user", user, "--endpoint", "/gen", "--estimate", "1"}, 3, []string{"DENIED"}},
		{"release", []string{"release", "--lease", lid[1]}, 0, []string{"released"}},
		{"release twice", []string{"release", "--lease", lid[1]}, 1, []string{"not_found"}},
		{"release no id", []string{"release"}, 2, []string{"--lease is required"}},
		{"estimate with cost", []string{"check", "--user", user, "--endpoint", "/gen", "--estimate", "5", "--cost", "2"}, 2, []string{"--estimate"}},
		{"ttl without estimate", []string{"check", "--user", user, "--endpoint", "/gen", "--reserve-ttl", "1m"}, 2, []string{"--reserve-ttl"}},
	}
	for _, st := range steps {
		stdout, stderr, code := runCmd(ctx, st.args, envs)
		if code != st.wantCode || slices.ContainsFunc(st.want, func(w string) bool { return !strings.Contains(stdout+stderr, w) }) {
			t.Errorf("%s: quotaflow %v: exit %d, output %q; want exit %d and %q", st.name, st.args, code, stdout+stderr, st.wantCode, st.want)
		}
	}
}
