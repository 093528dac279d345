// Package natstest runs real NATS servers with JetStream for tests: embedded in the test
// process, or as a separate process (the test binary re-executed as a nats-server) that a
// test can kill and restart on the same port and store.
package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// childEnv makes a test binary started by StartProcess serve NATS instead of running tests.
const childEnv = "QUOTAFLOW_NATSTEST_SERVE"

// Server is an embedded NATS server with JetStream, its data in a temporary folder.
type Server struct {
	// URL is the server's nats:// URL; it stays the same across Stop and Start.
	URL string

	mu   sync.Mutex
	srv  *server.Server
	port int
	dir  string
	own  bool // dir is ours to remove
}

// Start starts an embedded server on a free loopback port.
func Start() (*Server, error) {
	port, err := proctest.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := proctest.TempDir("nats")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: natsURL(port), port: port, dir: dir, own: true}
	if err := s.Start(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Main is a TestMain helper. In a process started by StartProcess it serves NATS until
// killed; otherwise it starts an embedded server, sets *srv, runs the tests and stops it.
func Main(m interface{ Run() int }, srv **Server) int {
	if spec := os.Getenv(childEnv); spec != "" {
		return serveChild(spec)
	}
	return proctest.Main("natstest", m, srv, Start)
}

// Start (re)starts the embedded server on its port and store.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	srv, err := run(s.port, s.dir)
	if err != nil {
		return err
	}
	s.srv = srv
	return nil
}

// Stop shuts the server down; clients see it go away and reconnect when it is started again.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	if s.own {
		os.RemoveAll(s.dir)
	}
}

// Connect returns a connection to the server that reconnects forever.
func (s *Server) Connect() (*nats.Conn, error) {
	return nats.Connect(s.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1))
}

// JetStream starts a server of the test's own and returns a JetStream client of it; both end
// with the test. For tests whose streams or buckets have fixed names (the rule store's, the
// events stream), which a server shared by parallel tests would mix up.
func JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s.JetStream(t)
}

// JetStream returns a JetStream client of the server over a connection that reconnects
// forever (Connect); the connection ends with the test.
func (s *Server) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return jetStreamOver(t, s.Connect)
}

// jetStreamOver is a JetStream client over a connection from connect, closed with the test.
func jetStreamOver(t testing.TB, connect func() (*nats.Conn, error)) jetstream.JetStream {
	t.Helper()
	nc, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func run(port int, dir string) (*server.Server, error) {
	return broker.Embedded("", proctest.Addr(port), dir, nil)
}

// Process is a nats-server running in a child process.
//
// Its Start (re)starts the process on its port and store and waits until it accepts
// connections; Stop kills the process (SIGKILL, as a crash would) and waits for it to exit;
// Close stops the process and removes its data.
type Process struct {
	// URL is the server's nats:// URL; it stays the same across Stop and Start.
	URL string

	*proc
}

// setupChild re-executes the test binary, told by childEnv to serve on ports[0] with its
// store in dir.
func setupChild(p *proctest.Process, dir string, ports []int) (*Process, proctest.Config, error) {
	return setupSpec(p, childSpec{Port: ports[0], Dir: dir})
}

// StartProcess starts a nats-server with JetStream as a separate process: the running test
// binary, whose TestMain must call Main.
func StartProcess() (*Process, error) {
	return proctest.Start("nats-proc", 1, setupChild)
}

// serveChild is the child side of StartProcess and StartCluster: serve spec (childSpec, JSON)
// until killed or interrupted.
func serveChild(spec string) int {
	var cs childSpec
	if err := json.Unmarshal([]byte(spec), &cs); err != nil {
		fmt.Fprintf(os.Stderr, "natstest: bad %s=%q: %v\n", childEnv, spec, err)
		return 2
	}
	var srv *server.Server
	opts, err := cs.options()
	if err == nil {
		srv, err = broker.EmbeddedWith(opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}

// natsURL is the URL of a server on the loopback port.
func natsURL(port int) string {
	return "nats://" + proctest.Addr(port)
}

// proc gives Process its Start, Stop and Close without adding exported fields to it.
type proc = proctest.Process

// Messages returns every message the stream holds now on subjects (all of them when none),
// oldest first, read with an ordered consumer that changes nothing on the server. It reads
// until the consumer has nothing pending: a fetch can come back empty before the end (a
// cluster whose stream leader just changed), which must not cut the list short.
func Messages(t testing.TB, js jetstream.JetStream, stream string, subjects ...string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			out = append(out, m)
		}
		if n > 0 {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 {
			return out
		}
		if ctx.Err() != nil {
			t.Fatalf("read stream %s: %d messages pending after %d read: %v", stream, info.NumPending, len(out), ctx.Err())
		}
	}
}
