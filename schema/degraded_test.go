package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/schema"
)

// degradedRow is a check of the upgrade test: allowed or not, answered by a fail mode or not.
type degradedRow struct {
	allowed, degraded bool
	n                 int
}

// insertDegradedRows stores rows of rule global-api, their ids prefixed so that batches differ.
func insertDegradedRows(ctx context.Context, c driver.Conn, db, prefix string, at time.Time, rows []degradedRow) error {
	b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+".decisions (id, time, time_us, tier, subject_dimension, subject_id, endpoint, rule_id, cost, allowed, degraded, fail_mode, stream_seq)")
	if err != nil {
		return err
	}
	i := 0
	for _, r := range rows {
		failMode := ""
		if r.degraded {
			failMode = map[bool]string{true: "open", false: "closed"}[r.allowed]
		}
		for range r.n {
			i++
			if err := b.Append(fmt.Sprintf("%s-%d", prefix, i), at, at.UnixMicro(), "free", "global", "*", "/v1/api", "global-api",
				int64(1), b2u(r.allowed), b2u(r.degraded), failMode, uint64(i)); err != nil {
				b.Abort()
				return err
			}
		}
	}
	return b.Send()
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// TestMigrateDegradedOldRows: on Debian's ClickHouse, rollup rows written before 0011 (the
// degraded decisions among them, counted then as denied only) read 0 in degraded_requests and
// degraded_denied once it ran, before and after their parts are merged with new ones, and the
// decisions stored after it are counted in them.
func TestMigrateDegradedOldRows(t *testing.T) {
	t.Parallel()
	c := conn(t)
	ctx := context.Background()
	const db = "degraded_upgrade_test"
	if err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	// The schema as it was before 0011: the migrations before it, run as Migrate runs them.
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == "degraded" {
			break
		}
		stmts, err := m.Statements(db, schema.Dialect{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stmts {
			if err := c.Exec(ctx, s); err != nil {
				t.Fatalf("migration %04d_%s: %v", m.Version, m.Name, err)
			}
		}
	}
	at := time.Now().UTC().Truncate(time.Minute)
	// 2 allowed, 3 denied by the limit, 4 allowed by fail-open, 5 denied by fail-closed.
	rows := []degradedRow{{allowed: true, n: 2}, {n: 3}, {allowed: true, degraded: true, n: 4}, {degraded: true, n: 5}}
	if err := insertDegradedRows(ctx, c, db, "old", at, rows); err != nil {
		t.Fatal(err)
	}
	const sums = "SELECT sum(requests), sum(denied_requests), sum(degraded_requests), sum(degraded_denied) FROM %s.%s"
	read := func(table string) ([4]uint64, error) {
		var got [4]uint64
		err := c.QueryRow(ctx, fmt.Sprintf(sums, db, table)).Scan(&got[0], &got[1], &got[2], &got[3])
		return got, err
	}
	// rollupsHold is the condition that every rollup table counts want requests.
	rollupsHold := func(want uint64) func() error {
		return func() error {
			for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
				var n uint64
				if err := c.QueryRow(ctx, fmt.Sprintf("SELECT sum(requests) FROM %s.%s", db, table)).Scan(&n); err != nil {
					return err
				}
				if n != want {
					return fmt.Errorf("%s: %d requests, want %d", table, n, want)
				}
			}
			return nil
		}
	}
	poll.Until(t, 30*time.Second, "the rollups holding the rows", rollupsHold(14))
	if _, applied, err := schema.Migrate(ctx, c, db); err != nil || len(applied) != len(ms) {
		t.Fatalf("Migrate over the old schema applied %v, %v; want every migration (none was recorded)", applied, err)
	}
	check := func(when string, want [4]uint64) {
		t.Helper()
		for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
			if got, err := read(table); err != nil || got != want {
				t.Errorf("%s: %s requests, denied, degraded, degraded denied = %v, %v; want %v", when, table, got, err, want)
			}
		}
	}
	check("after 0011", [4]uint64{14, 8, 0, 0})
	for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
		if err := c.Exec(ctx, "OPTIMIZE TABLE "+db+"."+table+" FINAL"); err != nil {
			t.Fatal(err)
		}
	}
	check("after OPTIMIZE FINAL", [4]uint64{14, 8, 0, 0})

	// The same checks again, now counted apart, and merged with the old rows of their key.
	if err := insertDegradedRows(ctx, c, db, "new", at, rows); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the rollups holding the rows", rollupsHold(28))
	check("new rows", [4]uint64{28, 16, 9, 5})
	for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
		if err := c.Exec(ctx, "OPTIMIZE TABLE "+db+"."+table+" FINAL"); err != nil {
			t.Fatal(err)
		}
		var parts uint64
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.%s", db, table)).Scan(&parts); err != nil || parts != 1 {
			t.Errorf("%s after OPTIMIZE FINAL: %d rows, %v; want the key's one", table, parts, err)
		}
	}
	check("new rows after OPTIMIZE FINAL", [4]uint64{28, 16, 9, 5})
}
