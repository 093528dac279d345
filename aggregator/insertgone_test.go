package aggregator_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/schema"
)

// TestInsertGone: the wait a recheck makes after a failed insert sees a query the server still
// runs under the insert's id (here a 2-second one), refuses to go on while it does, and goes on
// once it ended.
func TestInsertGone(t *testing.T) {
	t.Parallel()
	ch, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx := context.Background()
	id := "qf-insert-test-" + time.Now().Format("150405.000000")
	done := make(chan error, 1)
	go func() {
		done <- ch.Exec(clickhouse.Context(ctx, clickhouse.WithQueryID(id)), "SELECT sleep(2)")
	}()
	poll.Until(t, time.Minute, "the query to run", poll.True(func() bool {
		var n uint64
		return ch.QueryRow(ctx, "SELECT count() FROM system.processes WHERE query_id = ?", id).Scan(&n) == nil && n > 0
	}))
	if err := aggregator.InsertGone(ctx, ch, 200*time.Millisecond, id); err == nil {
		t.Fatal("InsertGone returned nil while the query runs, want an error")
	}
	if err := aggregator.InsertGone(ctx, ch, 10*time.Second, id); err != nil {
		t.Fatalf("InsertGone with time to wait: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		// The client learns of the end at once; a second is slack for a loaded machine, far
		// below the 1.8s left when the first InsertGone gave up.
		t.Fatal("InsertGone returned, but the query had not ended")
	}
	if err := aggregator.InsertGone(ctx, ch, time.Second, "qf-insert-never-ran"); err != nil {
		t.Errorf("InsertGone of an id never run: %v", err)
	}
}

// TestRecheckReadsDecisions: an insert cut off by the server's death can commit its decisions
// and not the view that records its messages (ingested_messages_mv): here the view is
// detached while the decisions of message 42 are written. The recheck after the failed insert
// then finds the message in the decisions table, within the batch's span of decision times,
// where ingested_messages has nothing; so it drops the rows instead of storing them twice.
func TestRecheckReadsDecisions(t *testing.T) {
	t.Parallel()
	ch, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx := context.Background()
	db := fmt.Sprintf("recheck_%d_%d", os.Getpid(), dbSeq.Add(1))
	if _, _, err := schema.Migrate(ctx, ch, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })
	if err := ch.Exec(ctx, "DETACH TABLE "+db+".ingested_messages_mv"); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Truncate(time.Second).Add(-time.Minute)
	if err := ch.Exec(ctx, fmt.Sprintf("INSERT INTO %s.decisions (id, time, time_us, partition, stream_seq) SELECT 'd-42', toDateTime(%d), toInt64(%d), toUInt16(3), toUInt64(42)",
		db, at.Unix(), at.UnixMicro())); err != nil {
		t.Fatal(err)
	}
	if err := ch.Exec(ctx, "ATTACH TABLE "+db+".ingested_messages_mv"); err != nil {
		t.Fatal(err)
	}
	if got, err := aggregator.StoredSeqs(ctx, ch, db, 3, 40, 45); err != nil || len(got) != 0 {
		t.Fatalf("ingested_messages: %v, %v; want nothing (the view was detached)", got, err)
	}
	us := at.UnixMicro()
	for _, tt := range []struct {
		name        string
		p           int
		lo, hi      uint64
		first, last int64
		want        bool
	}{
		{"the batch's span", 3, 40, 45, us - 500_000, us + 500_000, true},
		{"a span of one instant", 3, 42, 42, us, us, true},
		{"another partition", 4, 40, 45, us, us, false},
		{"other sequences", 3, 43, 50, us, us, false},
		{"a later span", 3, 40, 45, us + 10e6, us + 20e6, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := aggregator.StoredDecisions(ctx, ch, db, tt.p, tt.lo, tt.hi, tt.first, tt.last)
			if err != nil {
				t.Fatal(err)
			}
			if got[42] != tt.want || len(got) > 1 {
				t.Errorf("stored %v, want 42 %v", got, tt.want)
			}
		})
	}
}
