package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// The README's tour is a script: TestTour runs its commands in order against a stack as `make
// dev` runs it and compares each output with the README's. A tour block may be preceded by a
// comment saying what of its output varies or when it may lag:
//
//	<!-- tour: numbers vary -->   every number of the output (a load test's figures)
//	<!-- tour: retry -->          the command is run again until its output matches, for 30s
//	                              (what the aggregator stores within a second or two)
//
// Times, ids and waits always vary and are compared as placeholders (tourVarying).

// tourStep is one command of the tour and the output the README shows for it.
type tourStep struct {
	line        int // of the command in README.md
	cmd, want   string
	retry, vary bool
}

// parseTour reads the console blocks of README.md's tour section: "$ " starts a command (a
// trailing backslash continues it on the next line), every other line is its output.
func parseTour(t *testing.T, readme string) []tourStep {
	t.Helper()
	start := strings.Index(readme, "\n## A 5-minute tour\n")
	if start < 0 {
		t.Fatal(`README.md has no section "A 5-minute tour"`)
	}
	line := strings.Count(readme[:start], "\n") + 1
	var steps []tourStep
	var cur *tourStep
	in, retry, vary, continued := false, false, false, false
	for _, l := range strings.Split(readme[start+1:], "\n") {
		line++
		switch {
		case !in && strings.HasPrefix(l, "## ") && !strings.HasPrefix(l, "## A 5-minute tour"):
			return steps
		case !in && strings.HasPrefix(l, "<!-- tour:"):
			retry, vary = strings.Contains(l, "retry"), strings.Contains(l, "numbers vary")
		case !in && l == "```console":
			in = true
		case in && l == "```":
			in, retry, vary, cur = false, false, false, nil
		case in && continued:
			cur.cmd += "\n" + l
			continued = strings.HasSuffix(l, "\\")
		case in && strings.HasPrefix(l, "$ "):
			steps = append(steps, tourStep{line: line, cmd: l[2:], retry: retry, vary: vary})
			cur = &steps[len(steps)-1]
			continued = strings.HasSuffix(l, "\\")
		case in && cur != nil:
			cur.want += l + "\n"
		}
	}
	return steps
}

// tourVarying are what differs between any two runs of the tour, each with its placeholder.
var tourVarying = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?`), "<time>"},
	{regexp.MustCompile(`\b\d{2}:\d{2}:\d{2}(\.\d+)?\b`), "<time>"},
	{regexp.MustCompile(`\b(ovr|wt)-[0-9a-f]{8,}\b`), "<id>"},
	{regexp.MustCompile(`\b[0-9a-f]{12}-\d+\b`), "<id>"},
	{regexp.MustCompile(`retry after [0-9hms.]+`), "retry after <wait>"},
	{regexp.MustCompile(`(?i)(retry-after: |"retry_after":|;t=|x-ratelimit-reset: |"reset_at":|content-length: )\d+`), "$1<n>"},
	{regexp.MustCompile(`(?m)^Date: .*$`), "Date: <date>"},
	{regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}\b`), "<date>"},
	{regexp.MustCompile(`whsec_(…)?[A-Za-z0-9+/=]+`), "whsec_<secret>"},
	{regexp.MustCompile(`\b1[7-9]\d{8}\b`), "<unix>"},
}

// normalize is out as the README compares it: what varies replaced by placeholders (with vary,
// every number), runs of spaces and of box lines as one (tables are padded to their values).
func normalize(out string, vary bool) string {
	for _, v := range tourVarying {
		out = v.re.ReplaceAllString(out, v.with)
	}
	if vary {
		out = regexp.MustCompile(`\d+(\.\d+)?`).ReplaceAllString(out, "<n>")
		// bench's line of answers given by fail modes, printed only when Redis did not answer
		// some checks in time: a loaded machine's, documented beside the tour's bench.
		out = regexp.MustCompile(`(?m)^degraded .*$\n?`).ReplaceAllString(out, "")
	}
	out = strings.ReplaceAll(out, "\r", "")
	// protojson puts a space after each comma in some builds and not in others.
	out = regexp.MustCompile(`,[ \t]+`).ReplaceAllString(out, ",")
	out = regexp.MustCompile(`[ \t]+`).ReplaceAllString(out, " ")
	out = regexp.MustCompile(`─+`).ReplaceAllString(out, "─")
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	return strings.Join(lines, "\n")
}

// tourStack is what `make dev` runs, on ports of its own: quotaflow serve with the dev rules
// and the admin token dev-admin-token, its embedded NATS, a Redis database and a ClickHouse
// database of the test servers. Its commands run in dir, where bin/quotaflow is this test
// binary as quotaflow and .dev/nats/auth holds the NATS seeds, as in a checkout.
type tourStack struct {
	dir, addr, natsURL, db string
	serveLog               lockedWriter
	stop                   func() error
}

func startTourStack(t *testing.T) *tourStack {
	t.Helper()
	ports, err := proctest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	rulesPath, err := filepath.Abs("../../deploy/dev/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := &tourStack{dir: t.TempDir(), addr: proctest.Addr(ports[0]), natsURL: "nats://" + proctest.Addr(ports[1]),
		db: fmt.Sprintf("tour_%d", os.Getpid()), serveLog: lockedWriter{mu: &sync.Mutex{}, w: &bytes.Buffer{}}}
	os.MkdirAll(filepath.Join(s.dir, "bin"), 0o755)
	wrapper := fmt.Sprintf("#!/bin/sh\n%s=1 exec %q \"$@\"\n", asCheckerEnv, os.Args[0])
	if err := os.WriteFile(filepath.Join(s.dir, "bin", "quotaflow"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{ // deploy/dev/run.sh's
		"QUOTAFLOW_CLICKHOUSE_DSN": chSrv.DSN(s.db), "QUOTAFLOW_REDIS_URL": redisSrv.URL(40),
		"QUOTAFLOW_RULES": rulesPath, "QUOTAFLOW_LISTEN": s.addr, "QUOTAFLOW_TRUSTED_PROXIES": "127.0.0.1/32,::1/128",
		"QUOTAFLOW_NATS_LISTEN": proctest.Addr(ports[1]), "QUOTAFLOW_NATS_DIR": filepath.Join(s.dir, ".dev", "nats"),
		"QUOTAFLOW_SPOOL_DIR": filepath.Join(s.dir, ".dev", "spool"), "QUOTAFLOW_WEBHOOK_ALLOW_HOSTS": "127.0.0.1,localhost",
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--admin-token", "dev-admin-token"}, func(k string) string { return env[k] }, s.serveLog, s.serveLog)
	}()
	var once sync.Once
	var stopErr error
	s.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(20 * time.Second):
				stopErr = fmt.Errorf("serve did not stop within 20s")
			}
		})
		return stopErr
	}
	t.Cleanup(func() { s.stop() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + s.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited before it was ready: %v\n%s", err, s.serveLog.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not ready after 60s:\n%s", s.serveLog.String())
		}
	}
}

// exec runs one command of the tour as a shell in a checkout would (bash, from the stack's
// dir), aimed at the stack: its address for 127.0.0.1:8080, its ClickHouse and database for
// the dev ones. It returns stdout and stderr together, as a terminal shows them, written back
// in the README's terms.
func (s *tourStack) exec(t *testing.T, cmd string, env []string) string {
	t.Helper()
	host, port, _ := strings.Cut(strings.TrimPrefix(chSrv.DSN(""), "clickhouse://"), ":")
	port, _, _ = strings.Cut(port, "/")
	cmd = strings.NewReplacer("127.0.0.1:8080", s.addr, "--port 9000", "--host "+host+" --port "+port).Replace(cmd)
	if strings.HasPrefix(cmd, "clickhouse-client ") {
		cmd = strings.ReplaceAll(cmd, " quotaflow.", " "+s.db+".")
	}
	c := exec.Command("bash", "-c", cmd)
	c.Dir = s.dir
	c.Env = append(os.Environ(), "QUOTAFLOW_TARGET=http://"+s.addr, "QUOTAFLOW_NATS_URL="+s.natsURL)
	c.Env = append(c.Env, env...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() { <-ctx.Done(); c.Process.Kill() }()
	c.Run()
	return strings.NewReplacer(s.addr, "127.0.0.1:8080", s.natsURL, "nats://127.0.0.1:4222", s.db, "quotaflow").Replace(out.String())
}

// TestTour runs the README's tour top to bottom (tourStep), then stops the stack as Ctrl-C
// stops make dev: cleanly, with nothing logged above INFO on the way down (during the tour a
// loaded machine may have made Redis slow, which serve rightly warns about).
func TestTour(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	steps := parseTour(t, string(readme))
	if len(steps) < 8 {
		t.Fatalf("the tour has %d commands; want the pipeline end to end", len(steps))
	}
	s := startTourStack(t)
	var env []string
	record := os.Getenv("QUOTAFLOW_TOUR_RECORD") != "" // prints each output, to write the README from
	for _, step := range steps {
		if name, value, ok := strings.Cut(strings.TrimPrefix(step.cmd, "export "), "="); ok && strings.HasPrefix(step.cmd, "export ") {
			env = append(env, name+"="+value)
			continue
		}
		deadline := time.Now().Add(30 * time.Second)
		if record && step.retry {
			time.Sleep(3 * time.Second) // what the aggregator stores within a second or two
		}
		for {
			got := s.exec(t, step.cmd, env)
			if record {
				t.Logf("README.md:%d $ %s\n%s", step.line, step.cmd, got)
			}
			if normalize(got, step.vary) == normalize(step.want, step.vary) {
				break
			}
			if record {
				break
			}
			if !step.retry || time.Now().After(deadline) {
				t.Fatalf("README.md:%d: $ %s\ngot:\n%s\nwant:\n%s\n(compared as:\n%s\nand\n%s)", step.line, step.cmd, got, step.want,
					normalize(got, step.vary), normalize(step.want, step.vary))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// The console the tour sends its reader to, and an admin command without the token that
	// the tour exports: in a make dev checkout it names the token and its variable.
	resp, err := http.Get("http://" + s.addr + "/console/")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /console/: %v %v, want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	if got := s.exec(t, "./bin/quotaflow rules list", nil); !strings.Contains(got, "export QUOTAFLOW_ADMIN_TOKEN=dev-admin-token") {
		t.Errorf("rules list without a token in a make dev checkout: %q, want make dev's token named", got)
	}
	if got := s.exec(t, "./bin/quotaflow rules list --token dev-admin-token", nil); !strings.Contains(got, "user-exports") {
		t.Errorf("rules list: %q, want the dev rules", got)
	}
	before := len(s.serveLog.String())
	if err := s.stop(); err != nil {
		t.Errorf("serve stopped with %v, want a clean stop", err)
	}
	for l := range strings.Lines(s.serveLog.String()[before:]) {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("serve logged on its way down: %s", l)
		}
	}
}
