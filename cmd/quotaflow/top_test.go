package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/app/dashboard"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
)

// terminal is a child quotaflow process on a pseudo-terminal, whose screen output the test
// reads as a person's terminal would receive it.
type terminal struct {
	cmd  *exec.Cmd
	ptmx *os.File // the terminal's side the test reads and types into
	tty  *os.File // the process's side, kept open to read its mode
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{} // closed when the process exited
	err  error         // its exit, once done
}

// startTerminal runs quotaflow args on a new 120×40 pseudo-terminal (stdin, stdout and
// stderr); it is killed at the end of the test if still running.
func startTerminal(t *testing.T, args ...string) *terminal {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asCheckerEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	term := &terminal{cmd: cmd, ptmx: ptmx, tty: tty, done: make(chan struct{})}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			term.mu.Lock()
			term.out.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() { term.err = cmd.Wait(); close(term.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-term.done
		tty.Close()
		ptmx.Close()
	})
	return term
}

// screen is everything the process wrote since its last full redraw.
func (term *terminal) screen() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	s := term.out.String()
	if i := strings.LastIndex(s, dashboard.Redraw); i >= 0 {
		s = s[i+len(dashboard.Redraw):]
	}
	return s
}

// output is everything the process wrote.
func (term *terminal) output() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.out.String()
}

// waitScreen waits until ok accepts the screen, failing the test at ctx's end.
func (term *terminal) waitScreen(ctx context.Context, t *testing.T, what string, ok func(string) bool) string {
	t.Helper()
	for {
		s := term.screen()
		if ok(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the screen never showed %s; last screen:\n%s", what, strings.ReplaceAll(s, "\r\n", "\n"))
		case <-term.done:
			t.Fatalf("the process exited (%v) before the screen showed %s:\n%s", term.err, what, term.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitOutput waits until ok accepts everything the process wrote, failing the test at ctx's
// end. After the process exited its last writes still reach the reader: the test's side of
// the terminal stays open, so there is no end of file to wait for.
func (term *terminal) waitOutput(ctx context.Context, t *testing.T, what string, ok func(string) bool) string {
	t.Helper()
	for {
		s := term.output()
		if ok(s) {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the terminal never showed %s; it got:\n%q", what, s)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// canonical reports whether the terminal is in its ordinary (cooked) mode: lines edited and
// echoed, as a shell leaves it.
func (term *terminal) canonical(t *testing.T) bool {
	t.Helper()
	st, err := unix.IoctlGetTermios(int(term.tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return st.Lflag&unix.ICANON != 0 && st.Lflag&unix.ECHO != 0
}

// TestTop drives quotaflow top in a real pseudo-terminal over the real pipeline (checker,
// NATS, aggregator, ClickHouse): checks past a subject's limit make it the busiest subject,
// with its allowed and denied counts, and then throttled; q quits with exit status 0 and gives
// the terminal back: its mode as it was, the cursor shown, the alternate screen left.
func TestTop(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	p := startChecker(t, "top", ns.URL, t.TempDir())
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(databaseName("top")),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	term := startTerminal(t, "top", "--nats-url", ns.URL, "--interval", "100ms", "--window", "60s")
	// The first frame is drawn once the consumers exist: every check after it is counted.
	term.waitScreen(ctx, t, "the first frame", func(s string) bool { return strings.Contains(s, "BUSIEST SUBJECTS") })
	if term.canonical(t) {
		t.Error("the terminal is in canonical mode while top runs, want raw (keys read one at a time)")
	}
	// user-min allows 5 an hour: 5 allowed, 4 denied, and the subject is throttled. The user is
	// the run's own: its bucket outlives a run (go test -count).
	hog := "top-hog-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range 9 {
		if _, err := p.client.CheckRateLimit(ctx, userCheck(hog)); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	busiest := regexp.MustCompile(`BUSIEST SUBJECTS \(\d+\)\r\nSUBJECT\s+CHECKS/S\s+ALLOWED\s+DENIED\s*\r\nuser:` + hog + `\s+[\d.]+\s+5\s+4\s*\r\n`)
	throttled := regexp.MustCompile(`(?m)^throttled\s+user:` + hog + `\s+user-min\s`)
	s := term.waitScreen(ctx, t, "top-hog busiest (5 allowed, 4 denied) and throttled", func(s string) bool {
		return busiest.MatchString(s) && throttled.MatchString(strings.ReplaceAll(s, "\r\n", "\n"))
	})
	t.Logf("screen:\n%s", strings.ReplaceAll(s, "\r\n", "\n"))
	if _, err := term.ptmx.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.done:
	case <-ctx.Done():
		t.Fatal("top did not exit on q")
	}
	if term.err != nil {
		t.Errorf("top exited with %v after q, want status 0", term.err)
	}
	if !term.canonical(t) {
		t.Error("the terminal was left in raw mode after top exited")
	}
	term.waitOutput(ctx, t, "the alternate screen left", func(s string) bool { return strings.HasSuffix(s, dashboard.LeaveScreen) })
}

// TestTopPiped: with stdout not a terminal, top prints one plain snapshot after the first
// interval and exits 0; a missing decision stream is an error saying what to do.
func TestTopPiped(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, stderr, code := runCmd(ctx, []string{"top", "--nats-url", ns.URL, "--interval", "10ms"}, nil)
	if code != 1 || !strings.Contains(stderr, "no decision stream QUOTAFLOW_DECISIONS on this NATS: start a checker with --nats-url first") {
		t.Errorf("top without a decision stream: exit %d, stderr %q; want 1 and what to do", code, stderr)
	}
	startChecker(t, "top-piped", ns.URL, t.TempDir())
	// The publisher makes the stream in the background, once NATS answers it.
	js := ns.JetStream(t)
	for _, err := js.Stream(ctx, stream.Name); err != nil; _, err = js.Stream(ctx, stream.Name) {
		if ctx.Err() != nil {
			t.Fatalf("the checker made no decision stream: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stdout, stderr, code := runCmd(ctx, []string{"top", "--nats-url", ns.URL, "--interval", "10ms"}, nil)
	if code != 0 || !strings.Contains(stdout, "BUSIEST SUBJECTS (0)") || !strings.Contains(stdout, "CURRENT THROTTLES") ||
		strings.Contains(stdout, "\x1b") || strings.Contains(stdout, "q quits") {
		t.Errorf("top piped: exit %d, stdout %q, stderr %q; want 0 and one snapshot without escapes or keys", code, stdout, stderr)
	}
	for _, tt := range []struct{ args []string }{
		{[]string{"--window", "1500ms"}}, {[]string{"--interval", "1ms"}}, {[]string{"--rows", "0"}}, {[]string{"--since", "-1h"}},
	} {
		_, stderr, code := runCmd(ctx, append([]string{"top"}, tt.args...), nil)
		if code != 2 || !strings.Contains(stderr, tt.args[0]+": want") {
			t.Errorf("top %v: exit %d, stderr %q; want 2 naming %s", tt.args, code, stderr, tt.args[0])
		}
	}
}
