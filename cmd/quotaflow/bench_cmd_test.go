package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/app/loadgen"
	"github.com/quotaflow/quotaflow/internal/cli"
)

const benchCmdRules = `rules:
- {id: bench-big, dimension: user, endpoint: /big, algorithm: token_bucket, limit: 1000000000, window: 1s}
- {id: bench-big-ip, dimension: ip, endpoint: /big, algorithm: gcra, limit: 1000000000, window: 1s}
- {id: bench-big-key, dimension: apikey, endpoint: /big, algorithm: sliding_window_counter, limit: 1000000000, window: 1m}
- {id: bench-tiny, dimension: user, endpoint: /tiny, algorithm: fixed_window, limit: 2, window: 1h}
- {id: bench-closed, dimension: user, endpoint: /closed, algorithm: fixed_window, limit: 1000000000, window: 1s, fail_mode: closed}
entitlements:
- {id: bench-soft, dimension: user, period: 1mo, mode: soft}
- {id: bench-hard, dimension: user, period: 1mo}
`

// runBenchCmd runs `quotaflow bench args...`.
func runBenchCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return run(ctx, append([]string{"bench"}, args...), getenv, stdout, stderr)
}

// startBenchTarget serves a checker with benchCmdRules in process: the RateLimiter service and
// the RLS handler on one port, over HTTP/1.1 and h2c.
func startBenchTarget(t *testing.T) string {
	t.Helper()
	return startBenchTargetOn(t, redis.NewClient(&redis.Options{Addr: redisSrv.Addr, DB: 8, ContextTimeoutEnabled: true}))
}

// startBenchTargetOn is startBenchTarget over rdb, which it closes at the test's end.
func startBenchTargetOn(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	set, err := rules.Parse([]byte(benchCmdRules))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine := checker.New(checker.Config{Redis: rdb, Rules: set, RedisTimeout: 5 * time.Second, Logger: quiet})
	srv := transport.New(engine, transport.Config{Logger: quiet})
	mux := http.NewServeMux()
	mux.Handle(srv.RLSHandler())
	mux.Handle("/", srv.Handler())
	hs := httptest.NewUnstartedServer(mux)
	hs.Config.Protocols = new(http.Protocols)
	hs.Config.Protocols.SetHTTP1(true)
	hs.Config.Protocols.SetUnencryptedHTTP2(true)
	hs.Start()
	t.Cleanup(func() {
		hs.Close()
		engine.Close()
		rdb.Close()
	})
	return hs.URL
}

// bench runs `quotaflow bench --json` and decodes its report.
func bench(t *testing.T, args ...string) (*loadgen.Report, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := runBenchCmd(ctx, append([]string{"--json"}, args...), env(nil), &stdout, &stderr); err != nil {
		t.Fatalf("bench %v: %v\n%s", args, err, stderr.String())
	}
	var rep loadgen.Report
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("bench %v: report %q: %v", args, stdout.String(), err)
	}
	// A guard against a run that does not stop, not a speed check: on a loaded CI machine a
	// 1 s gRPC run has taken 13 s (connection set-up and teardown starved of CPU, before and
	// after this bound was first set at 10 s).
	if took := time.Since(start); took > 25*time.Second {
		t.Errorf("bench %v took %s: the run did not stop at its duration", args, took)
	}
	return &rep, stderr.String()
}

// checkReport asserts what holds for every complete run.
func checkReport(t *testing.T, rep *loadgen.Report) {
	t.Helper()
	if rep.Checks == 0 || rep.ChecksPerSec <= 0 || rep.Errors != 0 {
		t.Errorf("report %+v: want checks, checks_per_sec > 0 and no errors", rep)
	}
	if rep.Allowed+rep.Denied+rep.Errors != rep.Checks {
		t.Errorf("allowed %d + denied %d + errors %d != checks %d", rep.Allowed, rep.Denied, rep.Errors, rep.Checks)
	}
	if got := rep.ChecksPerSec * rep.DurationS; math.Abs(got-float64(rep.Allowed+rep.Denied)) > 0.01*float64(rep.Checks)+1 {
		t.Errorf("checks_per_sec %.1f × duration %.3fs = %.0f, want allowed+denied = %d", rep.ChecksPerSec, rep.DurationS, got, rep.Allowed+rep.Denied)
	}
	if !(0 < rep.P50Ms && rep.P50Ms <= rep.P90Ms && rep.P90Ms <= rep.P99Ms && rep.P99Ms <= rep.P999Ms && rep.P999Ms <= rep.MaxMs) {
		t.Errorf("percentiles p50 %v p90 %v p99 %v p99.9 %v max %v: want 0 < p50 <= ... <= max", rep.P50Ms, rep.P90Ms, rep.P99Ms, rep.P999Ms, rep.MaxMs)
	}
	if rep.Interrupted {
		t.Errorf("report says interrupted")
	}
}

// TestBenchProtocols runs each protocol closed and open loop with each distribution.
func TestBenchProtocols(t *testing.T) {
	t.Parallel()
	url := startBenchTarget(t)
	for _, protocol := range []string{"connect", "grpc", "rls"} {
		for _, mode := range []string{"closed", "open"} {
			for i, dist := range []string{"uniform", "zipf", "hot"} {
				t.Run(protocol+"/"+mode+"/"+dist, func(t *testing.T) {
					t.Parallel()
					dim := []string{"user", "ip", "apikey"}[i]
					args := []string{"--target", url, "--protocol", protocol, "--duration", "1s", "--distribution", dist,
						"--concurrency", "4", "--keys", "1000", "--endpoint", "/big", "--dimension", dim}
					if mode == "open" {
						args = append(args, "--rate", "200")
					}
					rep, _ := bench(t, args...)
					checkReport(t, rep)
					if rep.Denied != 0 || rep.Protocol != protocol || rep.Mode != mode || rep.Distribution != dist || rep.Keys != 1000 {
						t.Errorf("report %+v: want no denials and the settings echoed", rep)
					}
					if mode == "open" {
						// Every one of the 200 scheduled checks is sent, or counted as missed.
						if n := rep.Checks + rep.Missed; n < 199 || n > 201 {
							t.Errorf("open loop: %d checks + %d missed, want the 200 scheduled", rep.Checks, rep.Missed)
						}
					}
				})
			}
		}
	}
}

// TestBenchTinyLimit: a limit of 2 per subject per hour over 5 subjects allows exactly 10
// checks and denies the rest.
func TestBenchTinyLimit(t *testing.T) {
	t.Parallel()
	url := startBenchTarget(t)
	for _, protocol := range []string{"connect", "grpc", "rls"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			prefix := fmt.Sprintf("tiny-%s-%d-", protocol, time.Now().UnixNano())
			start := time.Now()
			rep, _ := bench(t, "--target", url, "--protocol", protocol, "--duration", "1s", "--concurrency", "2",
				"--rate", "300", "--keys", "5", "--key-prefix", prefix, "--endpoint", "/tiny")
			checkReport(t, rep)
			if lo, hi := hourly(start, 10); rep.Allowed < lo || rep.Allowed > hi || rep.Denied < 100 {
				t.Errorf("allowed %d, denied %d: want %d to %d allowed (2 × 5 subjects per hour's window) and the rest denied", rep.Allowed, rep.Denied, lo, hi)
			}
		})
	}
}

// TestBenchEntitlement: --entitlement names the entitlement every check burns: a soft one
// without grants allows every check (its overage), a hard one without grants denies them all;
// over RLS it is refused, naming the flag.
func TestBenchEntitlement(t *testing.T) {
	t.Parallel()
	url := startBenchTarget(t)
	for _, tt := range []struct {
		protocol, entitlement string
		allowed               bool
	}{{"grpc", "bench-soft", true}, {"connect", "bench-hard", false}} {
		rep, _ := bench(t, "--target", url, "--protocol", tt.protocol, "--duration", "500ms", "--concurrency", "2", "--endpoint", "/big",
			"--key-prefix", fmt.Sprintf("ent-%d-", time.Now().UnixNano()), "--entitlement", tt.entitlement)
		checkReport(t, rep)
		if (tt.allowed && rep.Denied != 0) || (!tt.allowed && rep.Allowed != 0) {
			t.Errorf("%s over %s: allowed %d, denied %d; want all allowed = %v", tt.entitlement, tt.protocol, rep.Allowed, rep.Denied, tt.allowed)
		}
	}
	_, stderr, code := runCmd(context.Background(), []string{"bench", "--target", url, "--protocol", "rls", "--entitlement", "bench-soft"}, nil)
	if code != 2 || !strings.Contains(stderr, "--entitlement") {
		t.Errorf("--entitlement over rls: exit %d, %q; want 2 naming the flag", code, stderr)
	}
}

// TestBenchChecker runs bench against the checker command, as an operator would.
func TestBenchChecker(t *testing.T) {
	t.Parallel()
	p := startChecker(t, "bench-"+time.Now().Format("150405000000"), natsSrv.URL, t.TempDir())
	for _, protocol := range []string{"connect", "grpc", "rls"} {
		// pipelineRules allow 5 per user per hour on /api/*.
		start := time.Now()
		rep, _ := bench(t, "--target", p.url, "--protocol", protocol, "--duration", "1s", "--concurrency", "2", "--rate", "300",
			"--keys", "3", "--key-prefix", fmt.Sprintf("cmd-%s-%d-", protocol, time.Now().UnixNano()), "--endpoint", "/api/items")
		if protocol == "rls" && rep.Errors > 0 && strings.Contains(strings.Join(rep.ErrorSamples, " "), "404") {
			t.Fatalf("rls: the checker answers 404: checker.Server.Handler must serve RLSHandler (mux.Handle(s.RLSHandler()))")
		}
		checkReport(t, rep)
		if lo, hi := hourly(start, 15); rep.Allowed < lo || rep.Allowed > hi || rep.Denied == 0 {
			t.Errorf("%s: allowed %d, denied %d; want %d to %d allowed (5 × 3 users per hour's window) and denials", protocol, rep.Allowed, rep.Denied, lo, hi)
		}
	}
}

// hourly bounds what limits of one-hour fixed windows allow, n per window, to a bench run that
// started at start and just ended: n, or when the run crossed the top of an hour, where the
// windows turn, up to twice n (a CI run at 22:00 once got 30 of 15).
func hourly(start time.Time, n uint64) (lo, hi uint64) {
	if !start.Truncate(time.Hour).Equal(time.Now().Truncate(time.Hour)) {
		return n, 2 * n
	}
	return n, n
}

// TestBenchTextAndProgress: the text report, warm-up not counted, and no progress on stderr,
// which is not a terminal (TestProgress shows it on one).
func TestBenchTextAndProgress(t *testing.T) {
	t.Parallel()
	url := startBenchTarget(t)
	var stdout, stderr bytes.Buffer
	err := runBenchCmd(context.Background(), []string{"--target", url, "--protocol", "grpc", "--warmup", "500ms", "--duration", "1500ms",
		"--concurrency", "32", "--rate", "100", "--endpoint", "/big", "--distribution", "zipf"}, env(nil), &stdout, &stderr)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"quotaflow bench: grpc to " + url + " for 1.5s, open loop at 100 checks/s", "checks/s ", "p50 ", "p99.9 ", "allowed     ", "denied      0", "errors      0"} {
		if !strings.Contains(out, want) {
			t.Errorf("report %q: want %q", out, want)
		}
	}
	if strings.Contains(out, "missed") {
		t.Errorf("report %q: 100 checks/s with 32 in flight should not miss any", out)
	}
	if strings.Contains(out, "degraded") {
		t.Errorf("report %q: no check was answered by a fail mode", out)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr %q, piped: want no progress", stderr.String())
	}
	var allowed int
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "allowed"); ok {
			fmt.Sscan(v, &allowed)
		}
	}
	if allowed < 140 || allowed > 151 {
		t.Errorf("allowed %d: want the 150 checks of the measured 1.5s, not the warm-up's", allowed)
	}
}

// TestBenchStops: cancelling the context ends a long run at once, with what was measured.
func TestBenchStops(t *testing.T) {
	t.Parallel()
	url := startBenchTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	err := runBenchCmd(ctx, []string{"--target", url, "--duration", "1h", "--concurrency", "2", "--rate", "50", "--json", "--endpoint", "/big"},
		env(nil), &stdout, &stderr)
	if err != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("bench: %v after %s, want nil soon after the cancel", err, time.Since(start))
	}
	var rep loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || !rep.Interrupted || rep.Errors != 0 || rep.Checks == 0 || rep.Missed != 0 {
		t.Errorf("report %s (%v): want interrupted, some checks, no errors or missed", stdout.String(), err)
	}
	// A target that is not there: every check is an error, none fatal, and the run still ends.
	stdout.Reset()
	if err := runBenchCmd(context.Background(), []string{"--target", "http://" + freeAddr(t), "--duration", "300ms", "--concurrency", "2", "--json"},
		env(nil), &stdout, &stderr); err != nil {
		t.Errorf("bench against nothing: %v, want a report of errors, not a failure", err)
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Errors == 0 || rep.Allowed+rep.Denied != 0 || len(rep.ErrorSamples) == 0 {
		t.Errorf("against nothing: %s (%v), want only errors, with samples", stdout.String(), err)
	}
}

func TestBenchUsage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--protocol", "smoke"}, nil, "--protocol: want connect, grpc, rls or gubernator"},
		{[]string{"--concurrency", "0"}, nil, "--concurrency: want 1 to"},
		{[]string{"--rate", "-1"}, nil, "--rate"},
		{[]string{"--duration", "0s"}, nil, "--duration: want more than 0"},
		{[]string{"--keys", "0"}, nil, "--keys: want 1 to 1000000"},
		{[]string{"--distribution", "pareto"}, nil, "--distribution: want uniform, zipf or hot"},
		{[]string{"--batch", "0"}, nil, "--batch: want 1 to 1000 checks per RPC, got 0"},
		{[]string{"--batch", "8", "--protocol", "rls"}, nil, "--batch: batches are CheckRateLimits calls, of --protocol connect or grpc, not rls"},
		{[]string{"--dimension", "global"}, nil, "--dimension: want user, ip or apikey"},
		{[]string{"--endpoint", "api"}, nil, "--endpoint"},
		{nil, map[string]string{"QUOTAFLOW_TARGET": "localhost:8080"}, `--target: want an http:// or https:// URL, got "localhost:8080"`},
		{[]string{"--help"}, nil, "QUOTAFLOW_TARGET"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli.ExitCode(runBenchCmd(context.Background(), tt.args, env(tt.env), &stdout, &stderr), &stderr)
		wantCode := 2
		if tt.args != nil && tt.args[0] == "--help" {
			wantCode = 0
		}
		if out := stdout.String() + stderr.String(); code != wantCode || !strings.Contains(out, tt.want) {
			t.Errorf("bench %v: exit %d, output %q; want exit %d and %q", tt.args, code, out, wantCode, tt.want)
		}
	}
}

// TestBenchDegraded: against a checker whose Redis does not answer, the report counts the
// answers its fail modes gave apart (degraded, degraded_denied): a fail-closed rule's denials
// are not the limit's, and the text report says so.
func TestBenchDegraded(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1: every check's Redis call is refused at once.
	url := startBenchTargetOn(t, redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1}))
	for _, tt := range []struct {
		name, endpoint string
		args           []string
		denied         bool
	}{
		{"connect fail closed", "/closed", []string{"--protocol", "connect"}, true},
		{"grpc fail open", "/big", []string{"--protocol", "grpc"}, false},
		{"grpc batch fail closed", "/closed", []string{"--protocol", "grpc", "--batch", "4"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep, _ := bench(t, append(tt.args, "--target", url, "--duration", "500ms", "--concurrency", "2", "--rate", "100",
				"--keys", "5", "--endpoint", tt.endpoint)...)
			checkReport(t, rep)
			wantDenied := uint64(0)
			if tt.denied {
				wantDenied = rep.Checks
			}
			if rep.Degraded != rep.Checks || rep.Denied != wantDenied || rep.DegradedDenied != wantDenied {
				t.Errorf("%d checks: %d denied, %d degraded, %d degraded denied; want all degraded, %d denied, by the fail mode",
					rep.Checks, rep.Denied, rep.Degraded, rep.DegradedDenied, wantDenied)
			}
		})
	}
	t.Run("text", func(t *testing.T) {
		t.Parallel()
		var stdout, stderr bytes.Buffer
		if err := runBenchCmd(context.Background(), []string{"--target", url, "--protocol", "grpc", "--duration", "500ms",
			"--concurrency", "2", "--rate", "100", "--endpoint", "/closed"}, env(nil), &stdout, &stderr); err != nil {
			t.Fatalf("bench: %v\n%s", err, stderr.String())
		}
		var denied, degraded, degradedDenied int
		for _, line := range strings.Split(stdout.String(), "\n") {
			if v, ok := strings.CutPrefix(line, "denied"); ok {
				fmt.Sscan(v, &denied)
			}
			if v, ok := strings.CutPrefix(line, "degraded"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%d of the answers, %d of the denials", &degraded, &degradedDenied)
			}
		}
		if denied == 0 || degraded != denied || degradedDenied != denied || !strings.Contains(stdout.String(), "fail modes") {
			t.Errorf("report %q: want every denial on a degraded line naming the fail modes", stdout.String())
		}
	})
}
