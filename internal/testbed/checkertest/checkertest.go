// Package checkertest serves checkers in tests: one loopback port split between grpc-go and
// net/http as the quotaflow command splits it, HTTP clients that speak HTTP/1.1 and h2c, and
// Redis clients configured as in production.
package checkertest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// Serve serves h, and the gRPC services register adds, on one loopback port until the test
// ends; it returns the base URL ("http://127.0.0.1:port").
func Serve(t testing.TB, h http.Handler, register func(*grpc.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	if register != nil {
		register(gs)
	}
	hs := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- grpcsplit.Serve(ctx, ln, gs, hs, time.Second, grpcsplit.Config{}) }()
	t.Cleanup(func() {
		cancel()
		// Streams a test left open (reflection, health Watch) are cut off at the timeout.
		if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// HTTPClient speaks HTTP/1.1 and, to servers that take it, h2c.
func HTTPClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetHTTP1(true)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// H2CClient forces HTTP/2 without TLS, as gRPC clients do.
func H2CClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// Redis returns a client of addr as the quotaflow command makes one: context deadlines
// enforced, default retries (a command on a pooled connection that died with a restarted Redis
// is retried within the deadline). The test closes it.
func Redis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
}

// OwnRedis starts a Redis of the test's own, which the test may stop, stall or inspect, and a
// client of it; both end with the test.
func OwnRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	rs, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	rdb := Redis(rs.Addr)
	t.Cleanup(func() { rdb.Close() })
	return rs, rdb
}

// ID makes an identifier unique to the running test, so that tests sharing a Redis never share
// a bucket: the test's name, a mark of this run of it (go test -count=N runs it again on the
// same servers), and name. Within one run the same name gives the same identifier.
func ID(t testing.TB, name string) string {
	mark, ok := runMarks.Load(t)
	if !ok {
		mark, ok = runMarks.LoadOrStore(t, processMark+strconv.FormatInt(runSeq.Add(1), 36))
		if !ok {
			t.Cleanup(func() { runMarks.Delete(t) })
		}
	}
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + mark.(string) + "-" + name
}

// IP is an IPv4 address of the running test's own (from ID(t, name)), for rules that count
// per address.
func IP(t testing.TB, name string) string {
	h := fnv.New32a()
	h.Write([]byte(ID(t, name)))
	v := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", byte(v>>16), byte(v>>8), byte(v))
}

var (
	runMarks sync.Map // testing.TB → its run's mark
	runSeq   atomic.Int64
	// processMark tells this process's runs from those of an earlier one on a server that
	// outlived it.
	processMark = strconv.FormatInt(time.Now().UnixNano()%(1<<30), 36) + "r"
)

// Logger is where test checkers log: nowhere, or stderr with QF_DEBUG=1.
func Logger() *slog.Logger {
	var w io.Writer = io.Discard
	if os.Getenv("QF_DEBUG") != "" {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// Rules parses a rules document or fails the test.
func Rules(t testing.TB, doc string) *rules.Set {
	t.Helper()
	s, err := rules.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	return s
}
