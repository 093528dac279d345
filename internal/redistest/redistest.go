// Package redistest runs a real redis-server on a free loopback port for tests.
//
// A test package starts one server from TestMain and shares it; tests isolate themselves by
// key prefix or by database number. A missing redis-server binary is a failure, never a skip:
// `make test` installs it.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by a test package.
type Server struct {
	// Addr is host:port of the server; it stays the same across Stop and Start.
	Addr string

	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start launches redis-server on a free loopback port with its data in a temporary folder.
func Start() (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found (run `make test`, which installs it): %w", err)
	}
	dir, err := os.MkdirTemp("", "quotaflow-redis-")
	if err != nil {
		return nil, fmt.Errorf("create redis data dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
	if err := s.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Main is a TestMain helper: it starts a server, runs the tests and stops the server. It sets
// *srv before the tests run.
func Main(m interface{ Run() int }, srv **Server) int {
	s, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 1
	}
	*srv = s
	code := m.Run()
	s.Close()
	return code
}

// URL is the redis:// URL of database db on the server.
func (s *Server) URL(db int) string {
	return fmt.Sprintf("redis://%s/%d", s.Addr, db)
}

// Client returns a client for database db; the caller closes it.
func (s *Server) Client(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, DB: db, ContextTimeoutEnabled: true})
}

// Start (re)starts the process on the same port and waits until it answers PING.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	_, port, _ := net.SplitHostPort(s.Addr)
	cmd := exec.Command("redis-server",
		"--bind", "127.0.0.1",
		"--port", port,
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--databases", "64",
		"--protected-mode", "yes",
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("redis-server stdout: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	var logMu sync.Mutex
	var logTail []string
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			logMu.Lock()
			logTail = append(logTail, sc.Text())
			if len(logTail) > 20 {
				logTail = logTail[1:]
			}
			logMu.Unlock()
		}
		cmd.Wait()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			break
		}
		select {
		case <-done:
			logMu.Lock()
			defer logMu.Unlock()
			return fmt.Errorf("redis-server exited at start: %s", strings.Join(logTail, "\n"))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-done
			return errors.New("redis-server did not answer PING within 10s")
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.cmd, s.done = cmd, done
	return nil
}

// Stop kills the process (as a crash would) and waits for it to exit. Data is not kept.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(filepath.Clean(s.dir))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
