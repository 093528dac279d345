package schema_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/schema"
)

var chSrv *clickhousetest.Server

func TestMain(m *testing.M) { os.Exit(clickhousetest.Main(m, &chSrv)) }

func conn(t *testing.T) driver.Conn {
	t.Helper()
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestParseDialect(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		version string
		modern  bool
		wantErr bool
	}{
		{"18.16.1", false, false},
		{"22.3.2.1", false, false},
		{"22.8.1", true, false},
		{"24.8.4.13", true, false},
		{"25.1", true, false},
		{"nope", false, true},
		{"x.y", false, true},
	} {
		d, err := schema.ParseDialect(tt.version)
		if (err != nil) != tt.wantErr || err == nil && d.Modern != tt.modern {
			t.Errorf("ParseDialect(%q) = %+v, %v; want modern %v, error %v", tt.version, d, err, tt.modern, tt.wantErr)
		}
	}
}

// TestStatementsModern: a current server gets TTL, LowCardinality and DateTime64; 18.16 gets none.
func TestStatementsModern(t *testing.T) {
	t.Parallel()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, modern := range []bool{false, true} {
		var all strings.Builder
		for _, m := range ms {
			stmts, err := m.Statements("qf", schema.Dialect{Modern: modern})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range stmts {
				all.WriteString(s + "\n")
			}
		}
		sql := all.String()
		for _, feature := range []string{"TTL toDateTime(time) + INTERVAL 90 DAY", "LowCardinality(String)", "DateTime64(6, 'UTC')", "non_replicated_deduplication_window", "TTL minute + INTERVAL 30 DAY", "TTL toDateTime(day) + INTERVAL 365 DAY", "TTL toDateTime(at) + INTERVAL 90 DAY", "TTL toDateTime(at) + INTERVAL 365 DAY"} {
			if got := strings.Contains(sql, feature); got != modern {
				t.Errorf("modern=%v: SQL contains %q = %v, want %v", modern, feature, got, modern)
			}
		}
	}
}

// TestMigrate runs the migrations on Debian's ClickHouse, twice and concurrently: every table
// exists, each migration is recorded, and a second run applies nothing.
func TestMigrate(t *testing.T) {
	t.Parallel()
	c := conn(t)
	ctx := context.Background()
	const db = "migrate_test"
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = schema.Migrate(ctx, c, db)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	d, applied, err := schema.Migrate(ctx, c, db)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Migrate applied %v, %v; want nothing", applied, err)
	}
	if d.Modern {
		t.Errorf("Debian's server %s detected as modern", d.Version)
	}
	var tables []string
	rows, err := c.Query(ctx, "SELECT name FROM system.tables WHERE database = ? ORDER BY name", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	want := "config_changes decisions entitlement_events ingested_messages ingested_messages_mv ledger ledger_decisions_mv ledger_grants_mv overrides schema_migrations state_transitions usage_day usage_day_mv usage_hour usage_hour_mv usage_minute usage_minute_mv webhook_deliveries"
	if got := strings.Join(tables, " "); got != want {
		t.Errorf("tables = %s, want %s", got, want)
	}
	ms, _ := schema.Migrations()
	var n uint64
	if err := c.QueryRow(ctx, "SELECT uniqExact(version) FROM "+db+".schema_migrations").Scan(&n); err != nil || n != uint64(len(ms)) {
		t.Errorf("schema_migrations holds %d versions (%v), want %d", n, err, len(ms))
	}
}

func TestMigrateBadDatabase(t *testing.T) {
	t.Parallel()
	if _, _, err := schema.Migrate(context.Background(), conn(t), "bad-name; DROP"); err == nil || !strings.Contains(err.Error(), "database") {
		t.Errorf("Migrate with a bad database name: %v, want an error naming the database", err)
	}
}

// TestRetention: the job drops the partitions wholly past each table's horizon and keeps
// the rest, rollups included.
func TestRetention(t *testing.T) {
	t.Parallel()
	c := conn(t)
	ctx := context.Background()
	const db = "retention_test"
	// The rows of an earlier run (-count) would be counted with this run's.
	if err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	if _, _, err := schema.Migrate(ctx, c, db); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	ages := []int{0, 29, 31, 89, 91, 200, 400} // days
	b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+".decisions (id, time, tier, cost, allowed, stream_seq)")
	if err != nil {
		t.Fatal(err)
	}
	for i, age := range ages {
		if err := b.Append(fmt.Sprint(i), now.AddDate(0, 0, -age), "free", int64(1), uint8(1), uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	// The event tables: state_transitions daily (90 days), overrides and config_changes monthly
	// (a year).
	for _, table := range []string{"state_transitions (id, at", "overrides (event_id, at", "config_changes (event_id, at"} {
		b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+table+")")
		if err != nil {
			t.Fatal(err)
		}
		for i, age := range ages {
			if err := b.Append(fmt.Sprint(i), now.AddDate(0, 0, -age)); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
	}
	dropped, err := schema.ApplyRetention(ctx, c, db, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) == 0 {
		t.Fatal("nothing dropped")
	}
	count := func(q string) uint64 {
		var n uint64
		if err := c.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	for _, tt := range []struct {
		query string
		want  uint64
	}{
		{"SELECT count() FROM " + db + ".decisions", 4},          // 0, 29, 31, 89 days
		{"SELECT sum(requests) FROM " + db + ".usage_minute", 2}, // 0, 29
		{"SELECT sum(requests) FROM " + db + ".usage_day", 6},    // all but 400 days
		{"SELECT sum(requests) FROM " + db + ".usage_hour", 6},   // the same months
		{"SELECT count() FROM " + db + ".decisions WHERE time < now() - INTERVAL 90 DAY", 0},
		{"SELECT count() FROM " + db + ".state_transitions", 4}, // 0, 29, 31, 89 days
		{"SELECT count() FROM " + db + ".overrides", 6},         // all but 400 days (whole months)
		{"SELECT count() FROM " + db + ".config_changes", 6},    // the same
	} {
		if got := count(tt.query); got != tt.want {
			t.Errorf("%s = %d, want %d", tt.query, got, tt.want)
		}
	}
	// A second run finds nothing more to drop.
	if again, err := schema.ApplyRetention(ctx, c, db, now); err != nil || len(again) != 0 {
		t.Errorf("second run dropped %v, %v; want nothing", again, err)
	}
}

func TestRetentionHorizons(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		table schema.Table
		want  schema.Horizon
	}{
		{schema.Decisions, schema.Horizon{Days: 90}},
		{schema.UsageMinute, schema.Horizon{Days: 30}},
		{schema.UsageHour, schema.Horizon{Days: 365, Monthly: true}},
		{schema.UsageDay, schema.Horizon{Days: 365, Monthly: true}},
		{schema.IngestedMessages, schema.Horizon{Days: 7}},
		{schema.StateTransitions, schema.Horizon{Days: 90}},
		{schema.Overrides, schema.Horizon{Days: 365, Monthly: true}},
		{schema.ConfigChanges, schema.Horizon{Days: 365, Monthly: true}},
	} {
		if got := schema.Retention(tt.table); got != tt.want {
			t.Errorf("Retention(%s) = %+v, want %+v", tt.table, got, tt.want)
		}
	}
}

// TestMigrateLock: a migrator waits while another holds the lock (here, a lock table nobody
// drops) and gives up when its context ends; a lock older than the stale age is taken for a
// crashed holder's and dropped, and the migration goes on and releases its own. Not parallel:
// it changes the stale age every Migrate of the package uses.
func TestMigrateLock(t *testing.T) {
	c := conn(t)
	ctx := context.Background()
	const db = "lock_test"
	for _, q := range []string{"DROP DATABASE IF EXISTS " + db, "CREATE DATABASE " + db,
		"CREATE TABLE " + db + ".migration_lock (holder String) ENGINE = Memory"} {
		if err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, _, err := schema.Migrate(short, c, db); err == nil || !strings.Contains(err.Error(), "migration lock") {
		t.Fatalf("Migrate while the lock is held: %v, want it to wait and give up", err)
	}
	defer schema.SetLockStale(schema.SetLockStale(-time.Second))
	if _, applied, err := schema.Migrate(ctx, c, db); err != nil || len(applied) == 0 {
		t.Fatalf("Migrate past a stale lock: %v, %v", applied, err)
	}
	var n uint64
	if err := c.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'migration_lock'", db).Scan(&n); err != nil || n != 0 {
		t.Errorf("lock tables left after Migrate: %d (%v), want 0", n, err)
	}
}
