package grpcsplit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// failingListener fails its first n accepts with err, then accepts.
type failingListener struct {
	net.Listener
	err   error
	n     atomic.Int64
	tries atomic.Int64
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.tries.Add(1)
	if l.n.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// logBuffer is a slog handler's output, safe to read while the servers write to it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// TestAcceptErrorsPass: accept failures that pass (no file handle left, as with 20,000 idle
// connections) are logged and retried, and the port goes on serving; they used to end Serve,
// and with it the process.
func TestAcceptErrorsPass(t *testing.T) {
	t.Parallel()
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			t.Parallel()
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &failingListener{Listener: inner, err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}}
			ln.n.Store(5)
			var logs logBuffer
			e := serveSplit(t, ln, Config{Logger: logs.logger()})
			resp, err := client(t, false).Get("http://" + e.addr + "/")
			if err != nil {
				t.Fatalf("after %d failed accepts: %v, want an answer", 5, err)
			}
			resp.Body.Close()
			if n := strings.Count(logs.String(), "accept failed; retrying"); n != 5 {
				t.Errorf("%d accept failures logged, want 5:\n%s", n, logs.String())
			}
		})
	}
}

// TestAcceptErrorEnds: an error that does not pass (the listener itself is broken) still ends
// Serve, rather than retrying forever.
func TestAcceptErrorEnds(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	broken := errors.New("broken listener")
	ln := &failingListener{Listener: inner, err: broken}
	ln.n.Store(1)
	hs := NewHTTPServer(http.NotFoundHandler(), Config{})
	if err := Serve(context.Background(), ln, grpc.NewServer(), hs, time.Second, Config{}); !errors.Is(err, broken) {
		t.Errorf("Serve = %v, want %v", err, broken)
	}
}

// TestEMFILE: with the process out of file handles for real (RLIMIT_NOFILE lowered in a child
// process), Serve waits and serves again once handles are free.
func TestEMFILE(t *testing.T) {
	if os.Getenv("GRPCSPLIT_EMFILE_CHILD") == "1" {
		emfileChild(t)
		return
	}
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestEMFILE$", "-test.v")
	cmd.Env = append(os.Environ(), "GRPCSPLIT_EMFILE_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func emfileChild(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip("no RLIMIT_NOFILE:", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	e := serveSplit(t, ln, Config{Logger: logs.logger()})
	// Handles for the servers' own needs, then none: what the clients' dials take, the
	// accepts lack.
	lim.Cur = uint64(openFiles(t) + 40)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip("cannot lower RLIMIT_NOFILE:", err)
	}
	var conns []net.Conn
	for !strings.Contains(logs.String(), "too many open files") {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			if len(conns) == 0 {
				t.Fatal(err)
			}
			c, conns = conns[len(conns)-1], conns[:len(conns)-1]
			c.Close() // room for the next dial: the backlog fills with connections to accept
			continue
		}
		conns = append(conns, c)
		if len(conns) > 1000 {
			t.Fatalf("1000 connections open and no accept failed: %s", logs.String())
		}
	}
	for _, c := range conns {
		c.Close()
	}
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	resp, err := client(t, false).Get("http://" + e.addr + "/")
	if err != nil {
		t.Fatalf("after running out of files: %v, want an answer", err)
	}
	resp.Body.Close()
}

func openFiles(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(entries)
}

// TestTimeoutsCloseConnections: a connection that is idle between requests, or sends its
// request slowly, is closed by the server after the configured time, on each stack.
func TestTimeoutsCloseConnections(t *testing.T) {
	t.Parallel()
	short := 100 * time.Millisecond
	e := newSplitEnv(t, Config{ReadHeaderTimeout: short, ReadTimeout: short, IdleTimeout: short})
	raw := []struct {
		name string
		send string
	}{
		{"idle HTTP/1.1 keep-alive", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"slow headers", "GET / HTTP/1.1\r\nHost: x\r\n"},
		{"slow body", "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"},
	}
	for _, tt := range raw {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, tt.send)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Errorf("read: %v, want EOF: the server closes the connection", err)
			}
		})
	}
	t.Run("idle h2c", func(t *testing.T) {
		t.Parallel()
		closed := make(chan struct{})
		tr := &http.Transport{Protocols: new(http.Protocols), DialContext: closeSignalDialer(closed)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get("http://" + e.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		waitClosed(t, closed)
	})
	t.Run("idle gRPC", func(t *testing.T) {
		t.Parallel()
		closed := make(chan struct{})
		dial := closeSignalDialer(closed)
		conn, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, closed)
	})
}

// TestLongAnswerOutlivesReadTimeout: the read timeout bounds the request, not the answer: a
// handler still answering over HTTP/1.1 after it is past (a health Watch) keeps its context.
func TestLongAnswerOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	short := 50 * time.Millisecond
	e := newSplitEnv(t, Config{ReadTimeout: short})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	poll.Until(t, 10*time.Second, "the request to reach the handler", poll.True(func() bool { return e.httpCalls.Load() == 1 }))
	time.Sleep(10 * short) // well past the read timeout: what is asserted is the context, not a time
	close(e.release)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "context: <nil>" {
		t.Errorf("answer %q, want the handler's context alive (context: <nil>)", body)
	}
}

// closeSignalDialer dials connections that close done when they end: the server closed them
// (the clients used here close idle connections only when told to, after the test).
func closeSignalDialer(done chan struct{}) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var once sync.Once
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &eofConn{Conn: c, eof: func() { once.Do(func() { close(done) }) }}, nil
	}
}

type eofConn struct {
	net.Conn
	eof func()
}

func (c *eofConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.eof()
	}
	return n, err
}

func waitClosed(t *testing.T, closed chan struct{}) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection is still open")
	}
}

// TestConnectionCap: past MaxConns, connections wait unaccepted, with a warning, until one
// closes.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	e := newSplitEnv(t, Config{MaxConns: 2, Logger: logs.logger()})
	request := func(c net.Conn) <-chan string {
		answer := make(chan string, 1)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		go func() {
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answer <- err.Error()
				return
			}
			resp.Body.Close()
			answer <- resp.Status
		}()
		return answer
	}
	var open []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := <-request(c); got != "200 OK" {
			t.Fatalf("within the cap: %s, want 200 OK", got)
		}
		open = append(open, c)
	}
	poll.Until(t, 10*time.Second, "the cap's warning", poll.True(func() bool { return strings.Contains(logs.String(), "connection limit reached") }))
	if !strings.Contains(logs.String(), "max_conns=2") {
		t.Errorf("the warning does not name the cap:\n%s", logs.String())
	}
	third, err := net.Dial("tcp", e.addr) // into the backlog
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	answer := request(third)
	// The splitter is waiting for a slot before it accepts: the third cannot have been served.
	if n := e.httpCalls.Load(); n != 2 {
		t.Errorf("%d requests served at the cap of 2 connections, want 2", n)
	}
	open[0].Close()
	if got := <-answer; got != "200 OK" {
		t.Errorf("once a connection closed: %s, want 200 OK", got)
	}
}
