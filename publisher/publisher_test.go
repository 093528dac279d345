package publisher

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func TestPublishAll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		n        int
		subjects int
		cfg      func(*Config)
	}{
		{name: "defaults", n: 10000, subjects: 50},
		{name: "small batches", n: 5000, subjects: 20, cfg: func(c *Config) { c.MaxBatch = 7 }},
		{name: "one partition", n: 3000, subjects: 5, cfg: func(c *Config) { c.Partitions = 1 }},
		{name: "slow flush", n: 2000, subjects: 300, cfg: func(c *Config) { c.FlushInterval = 50 * time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nc := connect(t)
			cfg := testConfig(t)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			c := newClient(t, nc, cfg)
			want := make(map[string]*quotaflowv1.Decision, tt.n)
			for i := range tt.n {
				id := fmt.Sprintf("d-%d", i)
				d := decision(id, fmt.Sprintf("user-%d", i%tt.subjects), int64(i))
				want[id] = decision(id, d.Subject.Identifier, int64(i))
				c.PublishDecision(d)
			}
			poll.Until(t, 10*time.Second, "all decisions acked", poll.True(func() bool {
				st := c.Stats()
				return st.Published+st.Replayed == int64(tt.n)
			}))
			closeClient(t, c, 5*time.Second)
			st := c.Stats()
			if st.Dropped != 0 || st.Queued != 0 || st.Pending != 0 || st.SpoolBytes != 0 {
				t.Errorf("stats after Close: %+v, want nothing dropped, queued, pending or spooled", st)
			}
			msgs := checkStream(t, nc, cfg, want, true)
			t.Logf("%d decisions in %d messages; stats %+v", tt.n, len(msgs), st)
		})
	}
}

// TestOutageEmbedded stops the client's own embedded server under load and starts it again.
func TestOutageEmbedded(t *testing.T) {
	t.Parallel()
	s, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	runOutage(t, nc, s.Stop, s.Start)
}

// TestOutageProcess kills a nats-server process (SIGKILL) under load and starts it again.
func TestOutageProcess(t *testing.T) {
	t.Parallel()
	p, err := natstest.StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	runOutage(t, connectURL(t, p.URL), p.Stop, p.Start)
}

// runOutage publishes from several goroutines, stops NATS for 300ms and starts it again:
// Publish stays fast, and the stream ends up with every decision exactly once, in order.
func runOutage(t *testing.T, nc *nats.Conn, stop func(), start func() error) {
	cfg := testConfig(t)
	c := newClient(t, nc, cfg)
	g := startPublishers(c, 4, 10)
	poll.Until(t, 10*time.Second, "first decisions published directly", poll.True(func() bool { return c.Stats().Published > 0 }))
	time.Sleep(100 * time.Millisecond)
	stop()
	time.Sleep(300 * time.Millisecond)
	during := c.Stats()
	if err := start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	// The client goes back to publishing directly once the spool is replayed.
	poll.Until(t, 10*time.Second, "direct publishing after the outage", poll.True(func() bool {
		return c.Stats().Published > during.Published
	}))
	direct := time.Since(restarted)
	time.Sleep(100 * time.Millisecond)
	sent, slowest, slow := g.halt()
	closeClient(t, c, 20*time.Second)
	st := c.Stats()
	t.Logf("%d decisions; Publish calls: slowest %v, %d over 50ms; direct again %v after the restart; stats during the outage %+v, at the end %+v",
		len(sent), slowest, slow, direct, during, st)
	// A Publish that waited for NATS would take the whole outage or an ack timeout; a few
	// calls may be descheduled for tens of milliseconds on a busy 2-core machine.
	if slowest > 250*time.Millisecond || slow > len(sent)/1000+3 {
		t.Errorf("slowest Publish call took %v, %d over 50ms: Publish must not wait for NATS", slowest, slow)
	}
	if st.Dropped != 0 {
		t.Errorf("Dropped = %d, want 0", st.Dropped)
	}
	if st.Spooled == 0 || st.Replayed == 0 {
		t.Errorf("Spooled = %d, Replayed = %d, want both > 0 after an outage", st.Spooled, st.Replayed)
	}
	if st.Published+st.Replayed < int64(len(sent)) {
		t.Errorf("Published + Replayed = %d, want at least %d", st.Published+st.Replayed, len(sent))
	}
	checkStream(t, nc, cfg, sent, true)
}

// TestRestartWithSpool: a client that never reaches NATS leaves its decisions in the spool;
// the next client on the same folder publishes them under their original message ids.
func TestRestartWithSpool(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.InstanceID = "first"
	const n = 3000
	a := newClient(t, connectURL(t, downURL), cfg)
	want := make(map[string]*quotaflowv1.Decision, n)
	for i := range n {
		id := fmt.Sprintf("d-%d", i)
		want[id] = decision(id, fmt.Sprintf("user-%d", i%40), int64(i))
		a.PublishDecision(decision(id, fmt.Sprintf("user-%d", i%40), int64(i)))
	}
	poll.Until(t, 10*time.Second, "all decisions spooled", poll.True(func() bool { return a.Stats().Spooled == n }))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := a.Close(ctx); err == nil {
		t.Fatal("Close with NATS down and a full spool: nil error, want the spool left over")
	}
	if st := a.Stats(); st.SpoolBytes == 0 || st.Published+st.Replayed != 0 {
		t.Fatalf("first client's stats %+v, want everything in the spool", st)
	}

	nc := connect(t)
	cfg.InstanceID = "second"
	b := newClient(t, nc, cfg)
	poll.Until(t, 10*time.Second, "spool replayed", poll.True(func() bool { return b.Stats().Replayed == n }))
	closeClient(t, b, 5*time.Second)
	if st := b.Stats(); st.Dropped != 0 || st.SpoolBytes != 0 {
		t.Errorf("second client's stats %+v, want nothing dropped or left", st)
	}
	for _, m := range checkStream(t, nc, cfg, want, true) {
		if !strings.HasPrefix(m.msgID, "first.") {
			t.Errorf("replayed message id %q, want the first client's", m.msgID)
			break
		}
	}
}

// fileRecord is a record of a segment file, decoded.
type fileRecord struct {
	off       int64
	msgID     string
	decisions []*quotaflowv1.Decision
}

// spoolRecords decodes the records of a segment file.
func spoolRecords(t *testing.T, path string) (recs []fileRecord, size int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < int64(len(b)); {
		n := int64(binary.LittleEndian.Uint32(b[off:]))
		rec, err := parsePayload(b[off+recHeader : off+recHeader+n])
		if err != nil {
			t.Fatal(err)
		}
		var batch quotaflowv1.DecisionBatch
		if err := proto.Unmarshal(rec.data, &batch); err != nil {
			t.Fatal(err)
		}
		if int64(len(batch.Decisions)) != rec.count {
			t.Fatalf("record at %d: count %d, %d decisions", off, rec.count, len(batch.Decisions))
		}
		recs = append(recs, fileRecord{off: off, msgID: rec.id, decisions: batch.Decisions})
		off += recHeader + n
	}
	return recs, int64(len(b))
}

// TestTornTail damages the last record of the spool: the next client cuts it off and
// replays the complete records.
func TestTornTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// damage changes the segment file, given its last record's offset; it returns whether
		// the last record is lost.
		damage func(t *testing.T, path string, lastOff, size int64) bool
	}{
		{"garbage appended", func(t *testing.T, path string, _, _ int64) bool {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.Write([]byte{200, 1, 0, 0, 9, 9, 9, 9, 1, 2, 3}) // a header promising 456 bytes, and 3
			return false
		}},
		{"half a header", func(t *testing.T, path string, _, _ int64) bool {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.Write([]byte{7, 0})
			return false
		}},
		{"last record truncated", func(t *testing.T, path string, _, size int64) bool {
			if err := os.Truncate(path, size-5); err != nil {
				t.Fatal(err)
			}
			return true
		}},
		{"last record corrupt", func(t *testing.T, path string, lastOff, _ int64) bool {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var b [1]byte
			f.ReadAt(b[:], lastOff+20)
			b[0] ^= 0xff
			f.WriteAt(b[:], lastOff+20)
			return true
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			cfg.MaxBatch = 100
			const n = 1000
			a := newClient(t, connectURL(t, downURL), cfg)
			all := make([]*quotaflowv1.Decision, n)
			for i := range n {
				id := fmt.Sprintf("d-%d", i)
				all[i] = decision(id, fmt.Sprintf("user-%d", i%3), int64(i))
				a.PublishDecision(decision(id, all[i].Subject.Identifier, int64(i)))
			}
			poll.Until(t, 10*time.Second, "all decisions spooled", poll.True(func() bool { return a.Stats().Spooled == n }))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			a.Close(ctx)

			segs, _ := filepath.Glob(filepath.Join(cfg.SpoolDir, "*.seg"))
			if len(segs) != 1 {
				t.Fatalf("spool segments %v, want 1", segs)
			}
			recs, size := spoolRecords(t, segs[0])
			if len(recs) < 2 {
				t.Fatalf("%d records in the spool, want several", len(recs))
			}
			last := recs[len(recs)-1]
			lost := tt.damage(t, segs[0], last.off, size)
			want := map[string]*quotaflowv1.Decision{}
			for _, d := range all {
				want[d.Id] = d
			}
			if lost {
				for _, d := range last.decisions {
					delete(want, d.Id)
				}
			}
			wantReplayed := int64(len(want))

			nc := connect(t)
			b := newClient(t, nc, cfg)
			poll.Until(t, 10*time.Second, "complete records replayed", poll.True(func() bool { return b.Stats().Replayed == wantReplayed }))
			closeClient(t, b, 5*time.Second)
			checkStream(t, nc, cfg, want, true)
			if st := b.Stats(); st.Replayed != wantReplayed || st.Dropped != 0 {
				t.Errorf("stats %+v, want %d replayed and none dropped", st, wantReplayed)
			}
		})
	}
}

// captureHandler records the log records at error level.
type captureHandler struct {
	slog.Handler
	mu     sync.Mutex
	errors []string
}

func (h *captureHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.mu.Lock()
		h.errors = append(h.errors, r.Message)
		h.mu.Unlock()
	}
	return h.Handler.Handle(ctx, r)
}

func (h *captureHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &captureWith{h: h, Handler: h.Handler.WithAttrs(attrs)}
}

type captureWith struct {
	slog.Handler
	h *captureHandler
}

func (w *captureWith) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		w.h.mu.Lock()
		w.h.errors = append(w.h.errors, r.Message)
		w.h.mu.Unlock()
	}
	return w.Handler.Handle(ctx, r)
}

// TestSpoolFull fills a tiny spool with NATS down: the decisions past the bound are dropped,
// loudly, and those spooled before are published by the next client.
func TestSpoolFull(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	capture := &captureHandler{Handler: cfg.Logger.Handler()}
	cfg.Logger = slog.New(capture)
	cfg.SpoolMaxBytes = 64 << 10
	cfg.SegmentBytes = 16 << 10
	cfg.MaxBatch = 20
	const n = 3000
	a := newClient(t, connectURL(t, downURL), cfg)
	all := make([]*quotaflowv1.Decision, n)
	for i := range n {
		id := fmt.Sprintf("d-%d", i)
		all[i] = decision(id, "user-1", int64(i))
		a.PublishDecision(decision(id, "user-1", int64(i)))
	}
	poll.Until(t, 10*time.Second, "every decision spooled or dropped", poll.True(func() bool {
		st := a.Stats()
		return st.Spooled+st.Dropped == n
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	a.Close(ctx)
	st := a.Stats()
	if st.Dropped == 0 || st.Spooled == 0 {
		t.Fatalf("stats %+v, want some decisions spooled and some dropped", st)
	}
	if st.SpoolBytes > cfg.SpoolMaxBytes {
		t.Errorf("spool holds %d bytes, want at most %d", st.SpoolBytes, cfg.SpoolMaxBytes)
	}
	capture.mu.Lock()
	logged := append([]string(nil), capture.errors...)
	capture.mu.Unlock()
	if len(logged) == 0 || len(logged) > 3 {
		t.Errorf("error logs %q, want one or two (rate-limited) about dropped decisions", logged)
	}

	nc := connect(t)
	cfg.Logger = testLogger(t)
	b := newClient(t, nc, cfg)
	poll.Until(t, 10*time.Second, "spool replayed", poll.True(func() bool { return b.Stats().Replayed == st.Spooled }))
	closeClient(t, b, 5*time.Second)
	// Everything was spooled in order, so the spool kept the first decisions.
	want := map[string]*quotaflowv1.Decision{}
	for _, d := range all[:st.Spooled] {
		want[d.Id] = d
	}
	checkStream(t, nc, cfg, want, true)
}

// TestQueueFull: with a tiny queue Publish spools what does not fit, and nothing is lost.
func TestQueueFull(t *testing.T) {
	t.Parallel()
	nc := connect(t)
	cfg := testConfig(t)
	cfg.QueueSize = 4
	c := newClient(t, nc, cfg)
	const n = 20000
	want := make(map[string]*quotaflowv1.Decision, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n / 4 {
				id := fmt.Sprintf("w%d-%d", w, i)
				d := decision(id, fmt.Sprintf("w%d-u%d", w, i%10), int64(i))
				mu.Lock()
				want[id] = decision(id, d.Subject.Identifier, int64(i))
				mu.Unlock()
				c.PublishDecision(d)
			}
		}()
	}
	wg.Wait()
	closeClient(t, c, 10*time.Second)
	st := c.Stats()
	t.Logf("stats %+v", st)
	if st.Dropped != 0 || st.Published+st.Replayed != n {
		t.Errorf("stats %+v, want %d published or replayed and none dropped", st, n)
	}
	if st.Spooled == 0 {
		t.Errorf("Spooled = 0, want the overflow of a 4-decision queue spooled")
	}
	checkStream(t, nc, cfg, want, false) // the spooled overflow overtakes the queue
}

func TestEnsureStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(connect(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.MaxAge = time.Hour
	tests := []struct {
		name    string
		maxAge  time.Duration
		dup     time.Duration
		wantAge time.Duration
		wantDup time.Duration
	}{
		{"create", time.Hour, 0, time.Hour, 2 * time.Minute},
		{"again", time.Hour, 0, time.Hour, 2 * time.Minute},
		{"longer max age", 2 * time.Hour, 0, 2 * time.Hour, 2 * time.Minute},
		{"duplicate window capped", time.Minute, 10 * time.Minute, time.Minute, time.Minute},
	}
	for _, tt := range tests {
		cfg.MaxAge, cfg.DuplicateWindow = tt.maxAge, tt.dup
		s, err := EnsureStream(ctx, js, cfg)
		if err != nil {
			t.Fatalf("%s: EnsureStream: %v", tt.name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := info.Config
		if got.MaxAge != tt.wantAge || got.Duplicates != tt.wantDup || got.Storage != jetstream.FileStorage ||
			got.Retention != jetstream.LimitsPolicy || got.Replicas != 1 ||
			len(got.Subjects) != 1 || got.Subjects[0] != cfg.SubjectPrefix+".>" {
			t.Errorf("%s: stream config MaxAge %v Duplicates %v Storage %v Retention %v Replicas %d Subjects %v, want %v %v file limits 1 [%s.>]",
				tt.name, got.MaxAge, got.Duplicates, got.Storage, got.Retention, got.Replicas, got.Subjects,
				tt.wantAge, tt.wantDup, cfg.SubjectPrefix)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	nc := connect(t)
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"stream with a dot", Config{Stream: "a.b"}, "stream name"},
		{"prefix with a wildcard", Config{SubjectPrefix: "a.*"}, "subject prefix"},
		{"prefix ending in a dot", Config{SubjectPrefix: "a."}, "subject prefix"},
		{"instance id with a dot", Config{InstanceID: "a.b"}, "instance id"},
	}
	for _, tt := range tests {
		tt.cfg.SpoolDir = t.TempDir()
		_, err := New(nc, tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: New error %v, want one about %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil conn): nil error")
	}
	// One client per spool folder.
	cfg := testConfig(t)
	newClient(t, nc, cfg)
	if _, err := New(nc, cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second client on a spool folder: error %v, want in use", err)
	}
	// Defaults.
	d := Config{}.withDefaults()
	if d.Stream != "QUOTAFLOW_DECISIONS" || d.SubjectPrefix != "quotaflow.decisions" || d.Partitions != 16 ||
		d.MaxBatch != 512 || d.FlushInterval != 5*time.Millisecond || d.QueueSize != 65536 || d.MaxPending != 256 ||
		d.MaxAge != 72*time.Hour || d.DuplicateWindow != 2*time.Minute || d.SpoolMaxBytes != 1<<30 {
		t.Errorf("defaults %+v", d)
	}
}
