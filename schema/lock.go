package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// lockTable is the table whose existence is the migration lock: ClickHouse has no locks, but a
// CREATE TABLE without IF NOT EXISTS succeeds for exactly one of concurrent creators (on a
// cluster, the DDL queue runs them one after the other, and the second fails on every server).
const lockTable = "migration_lock"

// lockStale is how old a lock may be before a migrator takes it for a crashed holder's and
// drops it: far longer than migrating takes (seconds; a cluster's DDL queue at most a minute or
// two), so that only a holder that died leaves one that old. A variable for the tests.
var lockStale = 10 * time.Minute

// lockPoll is how often a migrator waiting for the lock looks again.
const lockPoll = 100 * time.Millisecond

// lock takes db's migration lock, waiting while another migrator holds it (up to ctx's end),
// and returns the function that releases it. Migrators take turns so that a migration that
// re-creates a view (0007) never drops the view another migrator made while that migrator's
// aggregator already inserts: a waiter reads schema_migrations again once it holds the lock,
// and finds the migration done.
func (l Layout) lock(ctx context.Context, conn driver.Conn, db string) (func(), error) {
	create := "CREATE TABLE " + db + "." + lockTable + l.onCluster() + " (holder String) ENGINE = Memory"
	drop := "DROP TABLE IF EXISTS " + db + "." + lockTable + l.onCluster()
	for {
		err := conn.Exec(l.ddlContext(ctx), create)
		if err == nil {
			return func() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				_ = conn.Exec(l.ddlContext(ctx), drop) // a lock left behind goes stale
			}, nil
		}
		if !strings.Contains(err.Error(), "already exists") {
			return nil, fmt.Errorf("take the migration lock: %w", err)
		}
		var age uint32
		q := "SELECT toUInt32(now() - metadata_modification_time) FROM system.tables WHERE database = ? AND name = ?"
		if err := conn.QueryRow(ctx, q, db, lockTable).Scan(&age); err == nil && time.Duration(age)*time.Second > lockStale {
			if err := conn.Exec(l.ddlContext(ctx), drop); err != nil {
				return nil, fmt.Errorf("drop a stale migration lock: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the migration lock %s.%s (another migrator holds it; one older than %v is dropped): %w",
				db, lockTable, lockStale, errors.Join(ctx.Err(), err))
		case <-time.After(lockPoll):
		}
	}
}
