package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

var (
	redisSrv *redistest.Server
	natsSrv  *natstest.Server
	chSrv    *clickhousetest.Server
)

// TestMain gives the package one Redis and one embedded NATS; started as a child by
// natstest.StartProcess, the test binary serves NATS instead.
func TestMain(m *testing.M) { os.Exit(natstest.Main(withRedis{m}, &natsSrv)) }

type withRedis struct{ m *testing.M }

func (w withRedis) Run() int { return redistest.Main(withClickHouse(w), &redisSrv) }

type withClickHouse struct{ m *testing.M }

func (w withClickHouse) Run() int { return clickhousetest.Main(withTopologies(w), &chSrv) }

type withTopologies struct{ m *testing.M }

// Run runs the tests, then stops the Redis topologies they started (topology_test.go).
func (w withTopologies) Run() int {
	defer closeTopologies()
	return w.m.Run()
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func runCmd(ctx context.Context, args []string, getenv map[string]string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	err := run(ctx, args, env(getenv), &out, &errb)
	code = cli.ExitCode(err, &errb)
	return out.String(), errb.String(), code
}

func TestUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		want     string // in stdout+stderr
	}{
		{"no command", nil, nil, 2, "Commands:"},
		{"help", []string{"help"}, nil, 0, "checker"},
		{"help command", []string{"help", "checker"}, nil, 0, "QUOTAFLOW_REDIS_URL"},
		{"command help", []string{"check", "--help"}, nil, 0, "Exit status: 0 allowed, 3 denied"},
		{"unknown command", []string{"frobnicate"}, nil, 2, `unknown command "frobnicate"`},
		{"bad custom dimension", []string{"check", "--custom", "tenant", "--endpoint", "/x"}, nil, 2, `want name=value (tenant=acme), got "tenant"`},
		{"unknown flag", []string{"checker", "--nope"}, nil, 2, "unknown flag --nope"},
		{"stray argument", []string{"checker", "extra"}, nil, 2, `unexpected argument "extra"`},
		{"rules required", []string{"checker"}, nil, 2, "--rules (or QUOTAFLOW_RULES) is required"},
		{"bad env value", []string{"checker"}, map[string]string{"QUOTAFLOW_REDIS_TIMEOUT": "soon"}, 2, `QUOTAFLOW_REDIS_TIMEOUT="soon": invalid value for --redis-timeout`},
		{"bad health interval", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--health-interval", "1ms"}, nil, 2, "--health-interval: want at least 100ms, or negative for no reports, got 1ms"},
		{"bad aggregator health interval", []string{"aggregator"}, map[string]string{"QUOTAFLOW_HEALTH_INTERVAL": "10ms"}, 2, "--health-interval: want at least 100ms"},
		{"health interval in help", []string{"help", "aggregator"}, nil, 0, "QUOTAFLOW_HEALTH_INTERVAL"},
		{"bad max in flight", []string{"checker"}, map[string]string{"QUOTAFLOW_MAX_IN_FLIGHT": "many"}, 2, `QUOTAFLOW_MAX_IN_FLIGHT="many": invalid value for --max-in-flight`},
		{"max in flight in help", []string{"help", "checker"}, nil, 0, "QUOTAFLOW_MAX_IN_FLIGHT"},
		{"bad bucket layout", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--bucket-layout", "tiny"}, nil, 2, `invalid value "tiny" for flag --bucket-layout: unknown bucket layout "tiny" (want previous, compact, shared or mixed)`},
		{"bad shared hashes", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--shared-hashes", "0"}, nil, 2, `--shared-hashes: want 1 to 65536 hashes per cluster slot, got 0`},
		{"bad bucket layout env", []string{"checker"}, map[string]string{"QUOTAFLOW_BUCKET_LAYOUT": "tiny"}, 2, `QUOTAFLOW_BUCKET_LAYOUT="tiny": invalid value for --bucket-layout`},
		{"bucket layout in help", []string{"help", "checker"}, nil, 0, "QUOTAFLOW_BUCKET_LAYOUT"},
		{"bad redis url", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--redis-url", "http://x"}, nil, 2, "--redis-url: want a redis:// or rediss:// URL"},
		{"negative spool wait", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--spool-wait", "-1ms"}, nil, 2, "--spool-wait: want 0 (no wait) or more, got -1ms"},
		{"bad log level", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--log-level", "loud"}, nil, 2, "--log-level"},
		{"invalid rules", []string{"checker", "--rules", "testdata/invalid-rules.yaml"}, nil, 1, `rule "a" (rules[0]): dimension: unknown dimension "users"`},
		{"check needs a subject", []string{"check", "--endpoint", "/x"}, nil, 2, "name a subject"},
		{"check needs an endpoint", []string{"check", "--user", "u"}, nil, 2, "--endpoint is required"},
		{"check bad protocol", []string{"check", "--user", "u", "--endpoint", "/x", "--protocol", "smoke"}, nil, 2, "--protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), tt.args, tt.env)
			if code != tt.wantCode || !strings.Contains(stdout+stderr, tt.want) {
				t.Errorf("quotaflow %v: exit %d, output %q; want exit %d and %q", tt.args, code, stdout+stderr, tt.wantCode, tt.want)
			}
		})
	}
}

// freeAddr is a loopback address free now, for a server the test starts (outside the
// ephemeral range: proctest.FreePorts).
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return proctest.Addr(port)
}

// TestCheckerAndCheck runs the checker command with its settings from the environment (and a
// flag overriding one), calls it with the check command over each protocol, and stops it as
// SIGTERM would.
func TestCheckerAndCheck(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n- {id: two, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 2, window: 1h}\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		done <- run(ctx, []string{"checker", "--listen", addr}, env(map[string]string{
			"QUOTAFLOW_LISTEN":    "127.0.0.1:1", // the flag wins
			"QUOTAFLOW_REDIS_URL": redisSrv.URL(3),
			"QUOTAFLOW_RULES":     rulesPath,
			// Counts are the test: a check past the default 50 ms on a loaded machine would be
			// answered by the fail mode, uncharged (CI of this test once saw one).
			"QUOTAFLOW_REDIS_TIMEOUT": "5s",
		}), &out, &out)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil && resp.StatusCode == 200 {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checker not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	target := map[string]string{"QUOTAFLOW_TARGET": "http://" + addr}
	user := "cmd-" + time.Now().Format("150405.000000")
	var answers []string // each check's, all shown when one is wrong
	for i, protocol := range []string{"connect", "grpc", "grpcweb"} {
		stdout, stderr, code := runCmd(context.Background(), []string{"check", "--protocol", protocol, "--user", user, "--endpoint", "/x"}, target)
		answers = append(answers, stdout)
		wantCode, wantOut := 0, "ALLOWED"
		if i == 2 {
			wantCode, wantOut = 3, "DENIED"
		}
		if code != wantCode || !strings.Contains(stdout, wantOut) || !strings.Contains(stdout, "two") || strings.Contains(stdout, "DEGRADED") {
			t.Errorf("check #%d over %s: exit %d, stdout %q, stderr %q; want exit %d and %s by rule two, not degraded; the checks so far: %q",
				i+1, protocol, code, stdout, stderr, wantCode, wantOut, answers)
		}
	}
	stdout, _, code := runCmd(context.Background(), []string{"check", "--peek", "--json", "--user", user, "--endpoint", "/x"}, target)
	if code != 3 || !strings.Contains(stdout, `"remaining": "0"`) && !strings.Contains(stdout, `"remaining":  "0"`) {
		t.Errorf("check --peek --json: exit %d, stdout %q; want 3 and remaining 0", code, stdout)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("checker after shutdown: %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("checker did not shut down")
	}
	if _, _, code := runCmd(context.Background(), []string{"check", "--user", "u", "--endpoint", "/x", "--timeout", "1s"}, target); code != 1 {
		t.Errorf("check against a stopped checker: exit %d, want 1", code)
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if got := cli.ExitCode(denied(3), &b); got != 3 || b.Len() != 0 {
		t.Errorf("denied: exit %d, output %q; want 3 and nothing printed", got, b.String())
	}
	if got := cli.ExitCode(errors.New("boom"), &b); got != 1 || !strings.Contains(b.String(), "boom") {
		t.Errorf("error: exit %d, output %q; want 1 and the error", got, b.String())
	}
}

func TestCheckerGCPercent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		gogc   string
		want   int
		wantOK bool
	}{
		{"", 400, true},
		{"100", 0, false}, // the runtime already applied the user's GOGC
		{"off", 0, false},
	}
	for _, tt := range tests {
		got, ok := checkerGCPercent(func(k string) string {
			if k == "GOGC" {
				return tt.gogc
			}
			return ""
		})
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("GOGC=%q: got (%d, %v), want (%d, %v)", tt.gogc, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestHelpOfHelp asks for help about help, which once made run call itself until the stack
// overflowed.
func TestHelpOfHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help", "--help"}, {"help", "help"}, {"help", "-h"}, {"--help", "help"}, {"-h", "-help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), args, nil)
			if code != 0 || !strings.Contains(stdout, "Commands:") {
				t.Errorf("quotaflow %v: exit %d, stdout %q, stderr %q; want exit 0 and the command list", args, code, stdout, stderr)
			}
		})
	}
}

// TestMistypedFlag: a flag not defined is reported once, with the flag meant and where the
// help is, not followed by the whole help.
func TestMistypedFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--listn", "x"}, "quotaflow: serve: unknown flag --listn (did you mean --listen?)\nrun 'quotaflow serve --help' for its flags\n"},
		{[]string{"checker", "-redis-ulr=redis://x"}, "quotaflow: checker: unknown flag --redis-ulr (did you mean --redis-url?)\nrun 'quotaflow checker --help' for its flags\n"},
		{[]string{"watch", "warnings", "--cont", "1"}, "quotaflow: watch warnings: unknown flag --cont (did you mean --count?)\nrun 'quotaflow watch warnings --help' for its flags\n"},
		{[]string{"check", "--frobnicate"}, "quotaflow: check: unknown flag --frobnicate\nrun 'quotaflow check --help' for its flags\n"},
		{[]string{"checker", "--redis-timeout", "soon"}, "quotaflow: checker: invalid value \"soon\" for flag --redis-timeout: parse error\nrun 'quotaflow checker --help' for its flags\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), tt.args, nil)
			if code != 2 || stdout != "" || stderr != tt.want {
				t.Errorf("quotaflow %v: exit %d, stdout %q, stderr %q; want exit 2 and only %q", tt.args, code, stdout, stderr, tt.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"version"}} {
		stdout, stderr, code := runCmd(context.Background(), args, nil)
		if code != 0 || !strings.HasPrefix(stdout, "quotaflow ") || !strings.Contains(stdout, runtime.Version()) || stderr != "" {
			t.Errorf("quotaflow %v: exit %d, stdout %q, stderr %q; want exit 0 and quotaflow's version with %s", args, code, stdout, stderr, runtime.Version())
		}
	}
}

// TestCommandHelp pins what a command's help says where it once said something false or left
// something out.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args    []string
		want    []string
		notWant []string
	}{
		// serve never runs without publishing: without --nats-url it embeds NATS.
		{[]string{"serve", "--help"}, []string{"empty: serve starts an embedded NATS server"}, []string{"decisions are not published", "required without --nats-url"}},
		{[]string{"checker", "--help"}, []string{"empty: decisions are not published"}, nil},
		// Every target, whichever one's help.
		{[]string{"watch", "--help"}, []string{"watch [decisions|warnings|overrides|config|entitlements]", "\n  warnings ", "\n  overrides ", "\n  config ", "one line per decision"}, nil},
		{[]string{"help", "watch"}, []string{"\n  warnings ", "\n  config "}, nil},
		{[]string{"watch", "config", "--help"}, []string{"\n  decisions ", "one line each: time, action, rule or\nuser", "many configuration changes"}, nil},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), tt.args, nil)
			out := stdout + stderr
			if code != 0 {
				t.Errorf("exit %d, want 0", code)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("help does not say %q:\n%s", w, out)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out, w) {
					t.Errorf("help says %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestRulesFileErrors: what the commands that read a rules file print for a bad one: each
// problem once, with its line, in the file's words.
func TestRulesFileErrors(t *testing.T) {
	t.Parallel()
	typo := writeFile(t, "typo.yaml", "rules:\n  - id: a\n    dimension: user\n    endpoint: /x\n    algoritm: fixed_window\n    limit: 10\n    window: 1m\n")
	syntax := writeFile(t, "syntax.yaml", "rules:\n  - id: a\n    dimension: user\n    endpoint: /x\n    algorithm: fixed_window\n    limit: [10\n    window: 1m\n")
	twice := writeFile(t, "twice.yaml", `tiers: {free: {}, pro: {}}
default_tier: free
rules:
  - {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}
  - {id: b, dimension: user, endpoint: /x, algorithm: gcra, limit: 9, window: 1s}
  - {id: c, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}
  - {id: d, dimension: ip, endpoint: /x, algorithm: gcra, limit: 9, window: 1s}
`)
	admin := map[string]string{"QUOTAFLOW_TARGET": "http://127.0.0.1:1", "QUOTAFLOW_ADMIN_TOKEN": testToken()}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // the whole of stderr
	}{
		{"checker, unknown field", []string{"checker", "--rules", typo}, nil,
			"quotaflow: rules file " + typo + `: line 5: unknown field "algoritm" (did you mean "algorithm"?)` + "\n"},
		{"rules apply, unknown field", []string{"rules", "apply", "-f", typo}, admin,
			"quotaflow: rules file " + typo + `: line 5: unknown field "algoritm" (did you mean "algorithm"?)` + "\n"},
		{"checker, syntax", []string{"checker", "--rules", syntax}, nil,
			"quotaflow: rules file " + syntax + ": line 6: did not find expected ',' or ']'\n"},
		// Checked before the API is asked (nothing listens at the target): the problems have
		// their lines and are printed once.
		{"rules apply, problems", []string{"rules", "apply", "-f", twice}, admin,
			"quotaflow: rules file " + twice + ": refused, nothing was changed: 2 problems:\n" +
				`  line 5: rule "b": duplicates rule "a" for tiers "free" and "pro": same dimension, endpoint, algorithm, window (and network prefix) would share one bucket` + "\n" +
				`  line 7: rule "d": duplicates rule "c" for tiers "free" and "pro": same dimension, endpoint, algorithm, window (and network prefix) would share one bucket` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stdout, stderr, code := runCmd(context.Background(), tt.args, tt.env)
			if code != 1 || stdout != "" || stderr != tt.want {
				t.Errorf("quotaflow %v: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and stderr:\n%s", tt.args, code, stdout, stderr, tt.want)
			}
		})
	}
}
