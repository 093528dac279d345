package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// srv is the package's embedded NATS server, shared by the tests that do not stop it; each
// test uses its own stream, subject prefix and spool folder.
var srv *natstest.Server

func TestMain(m *testing.M) {
	os.Exit(natstest.Main(m, &srv))
}

// testRuns numbers the test configs: -count=N runs a test N times against the same server.
var testRuns atomic.Int64

// testConfig returns a config with a stream, subject prefix and spool folder of the test's own.
func testConfig(t testing.TB) Config {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, t.Name()) + "_" + strconv.FormatInt(testRuns.Add(1), 10)
	return Config{
		Stream:        "T_" + base,
		SubjectPrefix: "test." + base,
		SpoolDir:      t.TempDir(),
		Logger:        testLogger(t),
	}
}

// testLogger logs to t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// connect returns a connection to the shared server.
func connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// connectURL connects as the checker does: reconnect forever, no reconnect buffer.
func connectURL(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// downURL is a NATS URL nothing listens on.
const downURL = "nats://127.0.0.1:1"

// newClient starts a client that the test's cleanup closes.
func newClient(t testing.TB, nc *nats.Conn, cfg Config) *Client {
	t.Helper()
	c, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// closeClient closes c within d and fails the test on an error.
func closeClient(t testing.TB, c *Client, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v (stats %+v)", err, c.Stats())
	}
}

// decision returns a decision of the given subject identifier, its sequence in TimeUs.
func decision(id, identifier string, seq int64) *quotaflowv1.Decision {
	s := &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: identifier}
	return &quotaflowv1.Decision{
		Id:        id,
		CheckerId: "test",
		TimeUs:    seq,
		Subject:   s,
		Subjects:  []*quotaflowv1.Subject{s},
		Tier:      "free",
		Endpoint:  "/api/v1/orders",
		RuleId:    "user-min",
		Algorithm: "gcra",
		Cost:      1,
		Allowed:   true,
		Limit:     100,
		Remaining: 42,
		WindowMs:  60000,
		ResetAt:   1700000000,
	}
}

// streamMsg is a message read back from the stream.
type streamMsg struct {
	subject   string
	msgID     string
	count     string
	decisions []*quotaflowv1.Decision
}

// readStream returns every message of the stream, in stream order.
func readStream(t testing.TB, nc *nats.Conn, name string) []streamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := info.State.Msgs
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []streamMsg
	for uint64(len(out)) < want {
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d messages of %s", len(out), want, name)
		}
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var b quotaflowv1.DecisionBatch
			if err := proto.Unmarshal(m.Data(), &b); err != nil {
				t.Fatalf("decode DecisionBatch: %v", err)
			}
			out = append(out, streamMsg{subject: m.Subject(), msgID: m.Headers().Get(jetstream.MsgIDHeader),
				count: m.Headers().Get(stream.CountHeader), decisions: b.Decisions})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("fetch: %v", err)
		}
	}
	return out
}

// checkStream verifies the stream holds exactly the decisions of want (id → decision), each
// once, on its partition's subject, with a correct count header, and when ordered, the
// decisions of each subject identifier in increasing TimeUs order. It returns the messages.
func checkStream(t testing.TB, nc *nats.Conn, cfg Config, want map[string]*quotaflowv1.Decision, ordered bool) []streamMsg {
	t.Helper()
	cfg = cfg.withDefaults()
	msgs := readStream(t, nc, cfg.Stream)
	seen := make(map[string]bool, len(want))
	last := map[string]int64{}
	total, errs := 0, 0
	fail := func(format string, args ...any) {
		if errs++; errs <= 10 {
			t.Errorf(format, args...)
		}
	}
	for _, m := range msgs {
		if got, wantCount := m.count, strconv.Itoa(len(m.decisions)); got != wantCount {
			fail("message %s: %s header %q, want %q", m.msgID, stream.CountHeader, got, wantCount)
		}
		for _, d := range m.decisions {
			total++
			if seen[d.Id] {
				fail("decision %s is in the stream twice", d.Id)
			}
			seen[d.Id] = true
			w, ok := want[d.Id]
			if !ok {
				fail("decision %s was never published", d.Id)
				continue
			}
			if !proto.Equal(d, w) {
				fail("decision %s: got %v, want %v", d.Id, d, w)
			}
			if got, wantSubj := m.subject, fmt.Sprintf("%s.%d", cfg.SubjectPrefix, stream.Partition(d.Subject, cfg.Partitions)); got != wantSubj {
				fail("decision %s on subject %s, want %s", d.Id, got, wantSubj)
			}
			id := d.Subject.Identifier
			if prev, ok := last[id]; ordered && ok && d.TimeUs <= prev {
				fail("subject %s: decision %d after %d, want publish order", id, d.TimeUs, prev)
			}
			last[id] = d.TimeUs
		}
	}
	if total != len(want) || len(seen) != len(want) {
		t.Errorf("stream holds %d decisions (%d distinct) in %d messages, want %d", total, len(seen), len(msgs), len(want))
	}
	return msgs
}

// publisherGroup publishes from several goroutines until stopped, each to subjects of its
// own, and records the decisions and the slowest Publish call.
type publisherGroup struct {
	mu      sync.Mutex
	sent    map[string]*quotaflowv1.Decision
	slowest time.Duration
	slow    int // Publish calls over 50ms
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startPublishers runs n goroutines that each publish perBurst decisions every millisecond.
func startPublishers(c *Client, n, perBurst int) *publisherGroup {
	g := &publisherGroup{sent: map[string]*quotaflowv1.Decision{}, stop: make(chan struct{})}
	for w := range n {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			var slowest time.Duration
			slow := 0
			sent := map[string]*quotaflowv1.Decision{}
			for seq := int64(1); ; {
				select {
				case <-g.stop:
					g.mu.Lock()
					for id, d := range sent {
						g.sent[id] = d
					}
					g.slowest = max(g.slowest, slowest)
					g.slow += slow
					g.mu.Unlock()
					return
				default:
				}
				for range perBurst {
					id := fmt.Sprintf("w%d-%d", w, seq)
					d := decision(id, fmt.Sprintf("w%d-u%d", w, seq%37), seq)
					sent[id] = proto.Clone(d).(*quotaflowv1.Decision)
					start := time.Now()
					c.PublishDecision(d)
					took := time.Since(start)
					slowest = max(slowest, took)
					if took > 50*time.Millisecond {
						slow++
					}
					seq++
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return g
}

// halt stops the publishers and returns what they sent, the slowest Publish call and the
// number of calls over 50ms.
func (g *publisherGroup) halt() (map[string]*quotaflowv1.Decision, time.Duration, int) {
	close(g.stop)
	g.wg.Wait()
	return g.sent, g.slowest, g.slow
}
