package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/app/dashboard"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// fastHealth makes a daemon report its health every 100ms: the tests wait for reports.
func fastHealth(c *daemon.CheckerConfig) { c.Health.Interval = 100 * time.Millisecond }

// statusRun is one run of quotaflow status.
type statusRun struct {
	stdout, stderr string
	code           int
}

// statusShows is the condition that quotaflow status with args shows what ok accepts; it keeps
// its last run in *last.
func statusShows(args []string, last *statusRun, ok func(stdout string, code int) bool) func(context.Context) error {
	return func(ctx context.Context) error {
		stdout, stderr, code := runCmd(ctx, append([]string{"status"}, args...), nil)
		*last = statusRun{stdout, stderr, code}
		if !ok(stdout, code) {
			return fmt.Errorf("quotaflow status %v: exit %d\n%s%s", args, code, stdout, stderr)
		}
		return nil
	}
}

// TestStatus runs the real pipeline — two checkers each on its own Redis, an aggregator with
// ClickHouse, one NATS — with an admin's and a policy's override, and asks quotaflow status:
// all up is exit 0 with every process, both overrides (the policy's marked) and no fail mode;
// with one checker's Redis killed, that checker sees Redis down, its rules are answered by
// fail mode, the other checker still sees its Redis up, and the exit status is 4.
func TestStatus(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	own, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	up := startChecker(t, "status-up", ns.URL, t.TempDir(), fastHealth)
	startChecker(t, "status-lost", ns.URL, t.TempDir(), fastHealth, func(c *daemon.CheckerConfig) {
		c.Redis = redis.NewClient(&redis.Options{Addr: own.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		c.RedisTimeout = 100 * time.Millisecond
	})
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(databaseName("status")),
		Aggregator: aggregator.Config{InstanceID: "status-agg", FlushInterval: 100 * time.Millisecond},
		Health:     health.Config{Interval: 100 * time.Millisecond}})
	store, err := rulestore.Open(ctx, ns.JetStream(t), rulestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, o := range []rules.Override{
		{ID: "by-hand", Dimension: "user", Identifier: "vip", Limit: 50, Reason: "launch", Creator: "ops", Source: "admin"},
		{ID: "penalty-x", Dimension: "user", Identifier: "abuser", RuleID: "user-min", Multiplier: 0.5, Reason: "denied too often",
			Creator: "policy:penalty", Source: "penalty"},
	} {
		o.CreatedAt, o.ExpiresAt = now, now.Add(time.Hour)
		if err := store.PutOverride(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if _, err := up.client.CheckRateLimit(ctx, userCheck("status-u"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--nats-url", ns.URL}

	t.Run("all up", func(t *testing.T) {
		var run statusRun
		if err := poll.Wait(ctx, "every process reporting", statusShows(args, &run, func(out string, code int) bool {
			return code == 0 && strings.Contains(out, "PROCESSES (3 reporting)")
		})); err != nil {
			t.Fatal(err)
		}
		out := run.stdout
		t.Logf("quotaflow status:\n%s", out)
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^checker\s+status-up-\S+\s+.*\s+ok\s+ok\s+-\s`),
			regexp.MustCompile(`(?m)^checker\s+status-lost-\S+\s+.*\s+ok\s+ok\s+-\s`),
			regexp.MustCompile(`(?m)^aggregator\s+status-agg-\S+\s+.*\s+-\s+ok\s+ok\s+-\s+\d+ msgs, \d+ partitions`),
			regexp.MustCompile(`(?m)^OVERRIDES \(2 active\)`),
			regexp.MustCompile(`(?m)^\s+by-hand\s+user:vip\s+limit=50\s+.*\sops\s+launch$`),
			regexp.MustCompile(`(?m)^\s+penalty-x\s+user:abuser rule:user-min\s+limit×0.5\s+.*\spolicy penalty\s+denied too often$`),
			regexp.MustCompile(`(?m)^ANSWERING BY FAIL MODE NOW\n  none$`),
		} {
			if !want.MatchString(out) {
				t.Errorf("status does not match %s:\n%s", want, out)
			}
		}
		// The checks sent show as a rate in some report of the checker that took them.
		err := poll.Wait(ctx, "a checker's rate", statusShows(append([]string{"--format", "json"}, args...), &run, func(out string, _ int) bool {
			var st dashboard.Status
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status --format json: %v\n%s", err, out)
			}
			for _, r := range st.Processes {
				if strings.HasPrefix(r.Instance, "status-up-") && r.Checker != nil && r.Checker.Rates.Allowed > 0 {
					return true
				}
			}
			// Checks go on until a report sees some: a rate is over one interval only.
			up.client.CheckRateLimit(ctx, userCheck("status-more"))
			return false
		}))
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("redis down for one checker", func(t *testing.T) {
		own.Stop()
		var run statusRun
		if err := poll.Wait(ctx, "the lost checker's Redis down", statusShows(args, &run, func(out string, _ int) bool {
			return regexp.MustCompile(`(?m)^checker\s+status-lost-\S+\s+.*\s+DOWN \d+s\s+ok\s`).MatchString(out) &&
				strings.Contains(out, "rule user-min (open)")
		})); err != nil {
			t.Fatal(err)
		}
		out, code := run.stdout, run.code
		t.Logf("quotaflow status:\n%s", out)
		if code != 4 {
			t.Errorf("exit status %d with a Redis down, want 4", code)
		}
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^checker\s+status-up-\S+\s+.*\s+ok\s+ok\s+-\s`),
			regexp.MustCompile(`(?m)^  checker status-lost-\S+ sees redis down: `),
			regexp.MustCompile(`(?m)^  checker status-lost-\S+ rule user-min \(open\): redis unreachable \(circuit open\)$`),
			regexp.MustCompile(`(?m)^  checker status-lost-\S+ rule ip-sec \(open\): redis unreachable \(circuit open\)$`),
		} {
			if !want.MatchString(out) {
				t.Errorf("status does not match %s:\n%s", want, out)
			}
		}
		if strings.Contains(out, "checker status-up") && regexp.MustCompile(`checker status-up-\S+ rule`).MatchString(out) {
			t.Errorf("the checker whose Redis is up is listed as answering by fail mode:\n%s", out)
		}
		_, stderr, code := runCmd(ctx, append([]string{"status", "--format", "json"}, args...), nil)
		if code != 4 || !strings.Contains(stderr, "unhealthy: checker status-lost-") {
			t.Errorf("status --format json: exit %d, stderr %q; want 4 naming the checker", code, stderr)
		}
	})
}

// TestStatusNoProcess: a NATS no process reports to is exit 4, saying so; bad flags are 2,
// naming the flag.
func TestStatusNoProcess(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"nobody", []string{"--nats-url", ns.URL}, 4, "no checker or aggregator reports its health"},
		{"bad format", []string{"--nats-url", ns.URL, "--format", "yaml"}, 2, `--format: want text or json, got "yaml"`},
		{"bad url", []string{"--nats-url", "http://x"}, 2, `--nats-url: want a nats:// or tls:// URL, got "http://x"`},
		{"bad timeout", []string{"--timeout", "0s"}, 2, "--timeout: want more than 0, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), append([]string{"status"}, tt.args...), nil)
			if code != tt.wantCode || !strings.Contains(stdout+stderr, tt.want) {
				t.Errorf("quotaflow status %v: exit %d, output %q; want exit %d and %q", tt.args, code, stdout+stderr, tt.wantCode, tt.want)
			}
		})
	}
}
