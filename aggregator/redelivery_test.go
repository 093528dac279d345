package aggregator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// hookedConn is the real ClickHouse connection with hooks around the aggregator's inserts into
// decisions and its exactly-once lookups in ingested_messages: a stalled or lost insert, a
// failing lookup, on the real servers.
type hookedConn struct {
	driver.Conn
	inserts atomic.Int64
	lookups atomic.Int64 // started
	looked  atomic.Int64 // read to the end
	// send runs instead of the n-th (from 1) insert's Send, given the real one.
	send func(n int64, real func() error) error
	// lookup, when it returns an error, fails the n-th (from 1) lookup instead of running it.
	lookup func(n int64) error
}

func (c *hookedConn) PrepareBatch(ctx context.Context, query string, opts ...driver.PrepareBatchOption) (driver.Batch, error) {
	b, err := c.Conn.PrepareBatch(ctx, query, opts...)
	if err != nil || !strings.Contains(query, ".decisions ") || c.send == nil {
		return b, err
	}
	return hookedBatch{Batch: b, n: c.inserts.Add(1), c: c}, nil
}

func (c *hookedConn) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	if !strings.Contains(query, "ingested_messages") {
		return c.Conn.Query(ctx, query, args...)
	}
	if n := c.lookups.Add(1); c.lookup != nil {
		if err := c.lookup(n); err != nil {
			return nil, err
		}
	}
	rows, err := c.Conn.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return lookupRows{Rows: rows, c: c}, nil
}

type hookedBatch struct {
	driver.Batch
	n int64
	c *hookedConn
}

func (b hookedBatch) Send() error { return b.c.send(b.n, b.Batch.Send) }

type lookupRows struct {
	driver.Rows
	c *hookedConn
}

func (r lookupRows) Close() error {
	err := r.Rows.Close()
	r.c.looked.Add(1)
	return err
}

// waitStoredOnce publishes 200 more decisions (four messages; the last on partition 1 again,
// the partition of the test's first message), waits until all 250 are there and stops a. A
// partition's fetcher hands its messages over in order, so once the last is stored any copy of
// the first went into the same insert or an earlier one: the counts are final. Once Run
// returned, every insert has returned: the views are final too.
func (e *env) waitStoredOnce(stop func()) {
	e.t.Helper()
	e.publish(200, 50)
	deadline := time.Now().Add(60 * time.Second)
	for e.count("SELECT uniqExact(id) FROM %s.decisions") != 250 {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d distinct decisions stored after 60s, want 250", e.count("SELECT uniqExact(id) FROM %s.decisions"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	for _, q := range []string{"SELECT count() FROM %s.decisions", "SELECT sum(requests) FROM %s.usage_minute"} {
		if got := e.count(q); got != 250 {
			e.t.Errorf("%s = %d for 250 decisions published, want 250", fmt.Sprintf(q, e.db), got)
		}
	}
}

// TestRedeliveryDuringInsertIsStoredOnce: an insert stalls (held in Send) until its message's
// ack wait has expired and the redelivered copy has been fetched and looked up, so the lookup
// found nothing. The stall outlasts the insert timeout, so the attempt fails, whether or not
// the server stored it (both happen): the writer rechecks and stores the message, once, before
// it takes the copy, which must then add no rows. Before the writer kept the sequences of its
// recent inserts, the copy was inserted again: 300 rows for 250 decisions.
func TestRedeliveryDuringInsertIsStoredOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	started, release := make(chan struct{}), make(chan struct{})
	conn := &hookedConn{Conn: e.ch}
	conn.send = func(n int64, send func() error) error {
		if n == 1 {
			close(started)
			<-release
		}
		return send()
	}
	cfg := e.config("stall")
	cfg.AckWait = 1500 * time.Millisecond // > FlushInterval + InsertTimeout, as Config requires
	e.ch = conn
	_, stop := e.startWith(cfg)
	e.publish(50, 50) // one message, on partition 1
	waitClosed(t, started, "the first insert")
	// Its ack wait expires; the redelivered copy is fetched and looked up: the first lookup
	// was the original's, the second the copy's, both before the held insert is sent.
	poll.Until(t, time.Minute, "the redelivered copy's lookup", poll.True(func() bool { return conn.looked.Load() >= 2 }))
	close(release)
	e.waitStoredOnce(stop)
}

// TestNoInsertRetryBeforeRecheck: the first insert is stored but its answer is lost (an error
// after the server committed), and the recheck that follows fails. On ClickHouse 18.16 no
// deduplication token drops a second copy, so the writer must not send the rows again before a
// recheck has told it what is stored. Before, it sent them again after the failed recheck:
// 300 rows for 250 decisions.
func TestNoInsertRetryBeforeRecheck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var lostAt atomic.Int64 // lookups started when the first insert's answer was lost
	conn := &hookedConn{Conn: e.ch}
	conn.send = func(n int64, send func() error) error {
		err := send()
		if n == 1 && err == nil {
			lostAt.Store(conn.lookups.Load())
			return errors.New("test: the server's answer was lost")
		}
		return err
	}
	conn.lookup = func(n int64) error {
		if at := lostAt.Load(); at > 0 && n == at+1 {
			return errors.New("test: lookup failed")
		}
		return nil
	}
	e.ch = conn
	_, stop := e.startWith(e.config("lost"))
	e.publish(50, 50) // one message, on partition 1
	// Nothing else is published before the recheck failed: the failure is the recheck's.
	poll.Until(t, time.Minute, "a failed recheck", poll.True(func() bool { at := lostAt.Load(); return at > 0 && conn.lookups.Load() > at }))
	e.waitStoredOnce(stop)
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not happen within 60s", what)
	}
}
