package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s, err := redistest.StartSentinel(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	t.Logf("sentinel group started in %v", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	old, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if old != s.Nodes()[0] {
		t.Fatalf("sentinels report master %s, want %s", old.Addr, s.Nodes()[0].Addr)
	}
	rdb := s.Client()
	defer rdb.Close()
	writeReplicated(ctx, t, old, "bucket", "kept")

	start = time.Now()
	old.Kill()
	addr, err := s.WaitFailover(ctx, old.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sentinels failed over to %s in %v", addr, time.Since(start).Round(time.Millisecond))
	if m, err := s.Master(ctx); err != nil || m.Addr != addr {
		t.Fatalf("Master after the failover: %v, %v; want %s", m, err, addr)
	}
	// The client follows the sentinels to the new master, which has the write and takes more.
	// A client may see errors for a moment after a failover, until it finds the new master.
	var got string
	err = poll.Wait(ctx, "the write through the failover client", func(ctx context.Context) error {
		var err error
		got, err = rdb.Get(ctx, "bucket").Result()
		return err
	})
	if err != nil || got != "kept" {
		t.Errorf("get through the failover client after the failover: %q, %v", got, err)
	}
	if err := rdb.Set(ctx, "after", "written", 0).Err(); err != nil {
		t.Fatalf("set through the failover client after the failover: %v", err)
	}
	n := s.Nodes()[1].Client()
	defer n.Close()
	if got, err := n.Get(ctx, "after").Result(); err != nil || got != "written" {
		t.Errorf("the new master %s has %q, %v; want the client's write", n.Options().Addr, got, err)
	}
}

// containsLine reports whether text has line, as INFO replies do.
func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// writeReplicated sets key on master m and waits until its replica has it, so that a
// failover keeps it.
func writeReplicated(ctx context.Context, t *testing.T, m *redistest.Node, key, value string) {
	t.Helper()
	n := m.Client()
	defer n.Close()
	conn := n.Conn() // WAIT counts the replicas that have this connection's writes.
	defer conn.Close()
	if err := conn.Set(ctx, key, value, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if acks, err := conn.Wait(ctx, 1, 2*time.Second).Result(); err != nil || acks != 1 {
		t.Fatalf("wait for the replica of %s: %d acks, %v", m.Addr, acks, err)
	}
}
