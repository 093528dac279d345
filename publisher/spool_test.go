package publisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// openTestSpool opens a spool in dir, failing the test on an error.
func openTestSpool(t *testing.T, dir string, maxBytes, segBytes int64, dropped *atomic.Int64) *spool {
	t.Helper()
	s, err := openSpool(dir, maxBytes, segBytes, testLogger(t), func(n int64, _ string) { dropped.Add(n) })
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readAll reads the spool's records from the cursor on without committing them.
func readAll(t *testing.T, s *spool) []spoolRecord {
	t.Helper()
	var recs []spoolRecord
	for p := s.ackPos(); ; {
		rec, ok, err := s.read(p)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return recs
		}
		recs = append(recs, rec)
		p = rec.end
	}
}

// TestSpoolSegments appends across several segments, commits part, reopens and resumes at
// the cursor, then commits the rest and compacts.
func TestSpoolSegments(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var dropped atomic.Int64
	s := openTestSpool(t, dir, 1<<20, 1<<10, &dropped)
	const n = 100
	for i := range n {
		data := []byte(strings.Repeat(strconv.Itoa(i%10), 50+i))
		if err := s.append(i%16, fmt.Sprintf("inst.%d.%d", i%16, i), i+1, data); err != nil {
			t.Fatal(err)
		}
	}
	recs := readAll(t, s)
	if len(recs) != n {
		t.Fatalf("read %d records, want %d", len(recs), n)
	}
	for i, r := range recs {
		if r.partition != i%16 || r.id != fmt.Sprintf("inst.%d.%d", i%16, i) || r.count != int64(i+1) || len(r.data) != 50+i {
			t.Fatalf("record %d: partition %d id %s count %d %d bytes, want %d inst.%d.%d %d %d",
				i, r.partition, r.id, r.count, len(r.data), i%16, i%16, i, i+1, 50+i)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) < 5 {
		t.Fatalf("%d segments of at most 1 KiB for ~10 KiB, want several", len(segs))
	}
	s.commit(recs[59].end)
	before := s.pendingBytes()
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if after, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(after) >= len(segs) {
		t.Errorf("%d segments after committing 60 records, want fewer than %d", len(after), len(segs))
	}

	s = openTestSpool(t, dir, 1<<20, 1<<10, &dropped)
	if got := s.pendingBytes(); got != before {
		t.Errorf("pending bytes after reopening %d, want %d", got, before)
	}
	rest := readAll(t, s)
	if len(rest) != n-60 || rest[0].id != recs[60].id {
		t.Fatalf("after reopening: %d records from %q, want %d from %q", len(rest), rest[0].id, n-60, recs[60].id)
	}
	s.commit(rest[len(rest)-1].end)
	if !s.empty() {
		t.Errorf("spool not empty after committing every record: %d bytes", s.pendingBytes())
	}
	s.compact(0)
	if after, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(after) != 1 {
		t.Errorf("segments after compaction %v, want one", after)
	}
	if err := s.append(1, "inst.1.1000", 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s); len(got) != 1 || got[0].id != "inst.1.1000" {
		t.Errorf("after compaction and an append: %d records, want the new one", len(got))
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if dropped.Load() != 0 {
		t.Errorf("dropped %d, want 0", dropped.Load())
	}
}

// TestSpoolLimits: a full spool refuses records; a closed one too.
func TestSpoolLimits(t *testing.T) {
	t.Parallel()
	var dropped atomic.Int64
	s := openTestSpool(t, t.TempDir(), 1000, 400, &dropped)
	data := make([]byte, 100)
	var err error
	appended := 0
	for ; appended < 20; appended++ {
		if err = s.append(0, "i.0."+strconv.Itoa(appended), 1, data); err != nil {
			break
		}
	}
	if err != errSpoolFull || appended == 0 {
		t.Fatalf("after %d appends: error %v, want errSpoolFull after some", appended, err)
	}
	if got := s.pendingBytes(); got > 1000 {
		t.Errorf("spool holds %d bytes, want at most 1000", got)
	}
	s.close()
	if err := s.append(0, "i.0.x", 1, data); err != errSpoolClosed {
		t.Errorf("append after close: %v, want errSpoolClosed", err)
	}
}

// TestCrashRecovery: what the spool handed to the OS survives a crash of the process without
// Close (a copy of the folder while the client runs stands for kill -9): the next client
// publishes all of it. The spool is written to the OS every FlushInterval.
func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	a := newClient(t, connectURL(t, downURL), cfg)
	const n = 2000
	want := make(map[string]*quotaflowv1.Decision, n)
	for i := range n {
		id := fmt.Sprintf("d-%d", i)
		want[id] = decision(id, fmt.Sprintf("user-%d", i%30), int64(i))
		a.PublishDecision(decision(id, fmt.Sprintf("user-%d", i%30), int64(i)))
	}
	poll.Until(t, 10*time.Second, "all decisions spooled", poll.True(func() bool { return a.Stats().Spooled == n }))
	// The maintenance loop hands the spool's buffer to the OS every FlushInterval.
	poll.Until(t, 5*time.Second, "spool written to the OS", poll.True(func() bool {
		a.spool.mu.Lock()
		defer a.spool.mu.Unlock()
		return a.spool.flushed == a.spool.segs[len(a.spool.segs)-1].size
	}))
	crashed := t.TempDir()
	entries, err := os.ReadDir(cfg.SpoolDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == lockName {
			continue
		}
		copyFile(t, filepath.Join(cfg.SpoolDir, e.Name()), filepath.Join(crashed, e.Name()))
	}

	cfg.SpoolDir = crashed
	nc := connect(t)
	b := newClient(t, nc, cfg)
	poll.Until(t, 10*time.Second, "spool replayed", poll.True(func() bool { return b.Stats().Replayed == n }))
	closeClient(t, b, 5*time.Second)
	checkStream(t, nc, cfg, want, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	a.Close(ctx)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	copyOpen(t, in, to)
}

// copyIfPresent copies from to to unless from is gone: a file a running spool renamed or
// removed. Once open, it is copied whole, whatever the spool does to its name.
func copyIfPresent(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	copyOpen(t, in, to)
}

// copyOpen copies in, which it closes, to a new file to.
func copyOpen(t *testing.T, in *os.File, to string) {
	t.Helper()
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
