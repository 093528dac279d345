// Package proctest runs server processes for tests: a redis-server, a clickhouse-server or a
// re-executed test binary, on free loopback ports and with its data in a temporary folder, that
// a test can kill as a crash would and start again on the same ports and data.
//
// It is the machinery behind redistest, natstest and clickhousetest; those packages know each
// server's command line and how to ask it whether it is ready, this one the rest.
package proctest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Defaults for Config.Timeout and Config.Poll.
const (
	defaultTimeout = 10 * time.Second
	defaultPoll    = 20 * time.Millisecond
)

// tailSize bounds each log tail an error carries: enough for the lines a server prints as it
// fails, short enough that the test output stays readable.
const tailSize = 2000

// Config says how to run a server and how to tell that it is ready.
type Config struct {
	// Name names the server in errors, as in "redis-server exited at start".
	Name string
	// Path is the program to run: a path, or a name looked up in PATH and then in Search.
	Path string
	// Search are folders to look for Path in where PATH lacks it: Debian installs some servers
	// in /usr/sbin, which a user's PATH may not reach.
	Search []string
	// Args are the program's arguments, without the program name.
	Args []string
	// Env is added to the environment of the test process.
	Env []string
	// Dir is the working directory; empty means the test process's.
	Dir string
	// Output also receives what the server prints; nil means it is only kept for errors.
	Output io.Writer
	// LogFiles are files the server logs to by itself; errors carry their tails too.
	LogFiles []string
	// Ready reports whether the server serves. Start calls it until it returns nil, with a
	// context that ends at Timeout; nil means the server is ready once started.
	Ready func(ctx context.Context) error
	// Timeout bounds the wait for Ready; zero means DefaultTimeout.
	Timeout time.Duration
	// Poll is the pause between calls of Ready; zero means DefaultPoll.
	Poll time.Duration
}

// Process is a server process, made by Start, that a test can stop and start again. Its command
// line is fixed, so a restarted server listens on the same ports and finds the same data.
type Process struct {
	cfg  Config
	data string // the server's temporary folder, which Close removes

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Setup makes a test helper's server value S, which keeps p, for a server with its data in dir
// and listening on ports, and says how to run the server.
type Setup[S any] func(p *Process, dir string, ports []int) (*S, Config, error)

// Start creates a temporary folder named after server and finds n free loopback ports, which
// stay the server's across Stop and Start; it then starts the server that setup describes, as
// Process.Start does, and returns setup's value. If anything fails, it removes the folder, so
// that a failed start leaves nothing behind.
func Start[S any](server string, n int, setup Setup[S]) (*S, error) {
	dir, err := TempDir(server)
	if err != nil {
		return nil, err
	}
	p := &Process{data: dir}
	s, err := launch(p, n, setup)
	if err != nil {
		p.Close()
		return nil, err
	}
	return s, nil
}

// launch is Start once the folder exists.
func launch[S any](p *Process, n int, setup Setup[S]) (*S, error) {
	ports, err := FreePorts(n)
	if err != nil {
		return nil, err
	}
	s, cfg, err := setup(p, p.data, ports)
	if err != nil {
		return nil, err
	}
	if cfg.Path, err = lookPath(cfg.Path, cfg.Search); err != nil {
		return nil, err
	}
	p.cfg = cfg
	if err := p.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Start starts the server unless it is running, and waits until it is ready. If it exits or is
// not ready within Timeout, the error carries the tail of its output and log files.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	out := &tail{}
	cmd := exec.Command(p.cfg.Path, p.cfg.Args...)
	cmd.Dir = p.cfg.Dir
	if len(p.cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), p.cfg.Env...)
	}
	var w io.Writer = out
	if p.cfg.Output != nil {
		w = io.MultiWriter(out, p.cfg.Output)
	}
	cmd.Stdout, cmd.Stderr = w, w
	// A child of the server may hold its output open after the server is killed; Stop must not
	// wait for it.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.cfg.Name, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait() // The exit status shows in errors through cmd.ProcessState.
		close(done)
	}()
	if err := p.awaitReady(cmd, done, out); err != nil {
		return err
	}
	p.cmd, p.done = cmd, done
	return nil
}

// awaitReady polls cfg.Ready until it succeeds, the process exits or the timeout passes; in the
// last case it kills the process, so that a failed Start leaves nothing running.
func (p *Process) awaitReady(cmd *exec.Cmd, done <-chan struct{}, out *tail) error {
	if p.cfg.Ready == nil {
		return nil
	}
	timeout := orDefault(p.cfg.Timeout, defaultTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		err := p.cfg.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited at start (%s)%s", p.cfg.Name, cmd.ProcessState, p.logTail(out))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s did not answer within %gs: %w%s",
				p.cfg.Name, timeout.Seconds(), err, p.logTail(out))
		case <-time.After(orDefault(p.cfg.Poll, defaultPoll)):
		}
	}
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to exit. Its data stays
// for the next Start.
func (p *Process) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
	p.cmd, p.done = nil, nil
}

// Close stops the server and removes its data.
func (p *Process) Close() {
	p.Stop()
	os.RemoveAll(p.data)
}

// TempDir creates a temporary folder for a server's data, named after the server so that one
// left behind by a killed test run is recognisable.
func TempDir(server string) (string, error) {
	dir, err := os.MkdirTemp("", "quotaflow-"+server+"-")
	if err != nil {
		return "", fmt.Errorf("create %s data dir: %w", server, err)
	}
	return dir, nil
}

// lookPath finds a server's program in PATH or else in search. A missing server is a failure,
// never a skip, so the error says how to get it.
func lookPath(name string, search []string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	for _, dir := range search {
		p := filepath.Join(dir, name)
		if _, statErr := os.Stat(p); statErr == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (run `make test`, which installs it): %w", name, err)
}

// logTail is what the server last printed and logged, as a suffix for an error; empty if it
// said nothing.
func (p *Process) logTail(out *tail) string {
	var b strings.Builder
	b.Write(out.bytes())
	for _, f := range p.cfg.LogFiles {
		data, _ := os.ReadFile(f) // A server that failed early may not have written it.
		b.Write(data[max(0, len(data)-tailSize):])
	}
	s := strings.TrimSpace(b.String())
	if s == "" {
		return ""
	}
	return "; log tail:\n" + s
}

// tail keeps the last tailSize bytes written to it. The server writes it from exec's copying
// goroutine while Start may read it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if n := len(t.buf); n > tailSize {
		t.buf = append(t.buf[:0], t.buf[n-tailSize:]...)
	}
	return len(b), nil
}

func (t *tail) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

// orDefault is d, or def where d is unset.
func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
