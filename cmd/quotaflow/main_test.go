package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/natstest"
	"github.com/quotaflow/quotaflow/internal/redistest"
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
	code = exitCode(err, &errb)
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
		{"unknown flag", []string{"checker", "--nope"}, nil, 2, "flag provided but not defined: -nope"},
		{"stray argument", []string{"checker", "extra"}, nil, 2, `unexpected argument "extra"`},
		{"rules required", []string{"checker"}, nil, 2, "--rules (or QUOTAFLOW_RULES) is required"},
		{"bad env value", []string{"checker"}, map[string]string{"QUOTAFLOW_REDIS_TIMEOUT": "soon"}, 2, `QUOTAFLOW_REDIS_TIMEOUT="soon": invalid value for --redis-timeout`},
		{"bad redis url", []string{"checker", "--rules", "../../deploy/dev/rules.yaml", "--redis-url", "http://x"}, nil, 2, "--redis-url: want a redis:// or rediss:// URL"},
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

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
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
	for i, protocol := range []string{"connect", "grpc", "grpcweb"} {
		stdout, stderr, code := runCmd(context.Background(), []string{"check", "--protocol", protocol, "--user", user, "--endpoint", "/x"}, target)
		wantCode, wantOut := 0, "ALLOWED"
		if i == 2 {
			wantCode, wantOut = 3, "DENIED"
		}
		if code != wantCode || !strings.Contains(stdout, wantOut) || !strings.Contains(stdout, "two") {
			t.Errorf("check #%d over %s: exit %d, stdout %q, stderr %q; want exit %d and %s by rule two", i+1, protocol, code, stdout, stderr, wantCode, wantOut)
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
	if got := exitCode(deniedError{3}, &b); got != 3 || b.Len() != 0 {
		t.Errorf("denied: exit %d, output %q; want 3 and nothing printed", got, b.String())
	}
	if got := exitCode(errors.New("boom"), &b); got != 1 || !strings.Contains(b.String(), "boom") {
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
