package aggregator_test

import (
	"context"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
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
