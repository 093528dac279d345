// Package schema owns quotaflow's ClickHouse schema: versioned migrations (embedded SQL
// templates) and the retention job.
//
// One set of migrations serves both the ClickHouse Debian ships (18.16) and current servers.
// The server version, read at migration time, picks the dialect: current servers get TTL,
// LowCardinality and DateTime64(6); 18.16 gets plain String and DateTime, and its retention is
// enforced only by ApplyRetention dropping expired partitions, which the aggregator runs on a
// schedule against every server.
//
// The caller picks the Layout: one server (Migrate, ApplyRetention), or replicated over a
// ClickHouse cluster (OnCluster(name).Migrate, .ApplyRetention), where the same templates
// render Replicated engines, ON CLUSTER statements and Distributed tables for reads.
package schema

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// DefaultDatabase is the database quotaflow's tables live in.
const DefaultDatabase = "quotaflow"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Dialect is what the server supports, as far as the migrations care.
type Dialect struct {
	// Version is the server's version string.
	Version string
	// Modern is set from ClickHouse 22.8 on: TTL with ttl_only_drop_parts, LowCardinality,
	// DateTime64, insert_deduplication_token with non_replicated_deduplication_window.
	Modern bool
}

// String names the dialect as recorded in schema_migrations.
func (d Dialect) String() string {
	if d.Modern {
		return "modern"
	}
	return "legacy"
}

// ParseDialect returns the dialect of a server version such as "18.16.1" or "24.8.4.13".
func ParseDialect(version string) (Dialect, error) {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return Dialect{}, fmt.Errorf("clickhouse version %q: want major.minor", version)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return Dialect{}, fmt.Errorf("clickhouse version %q: want major.minor", version)
	}
	return Dialect{Version: version, Modern: major > 22 || major == 22 && minor >= 8}, nil
}

// DetectDialect asks the server for its version.
func DetectDialect(ctx context.Context, conn driver.Conn) (Dialect, error) {
	var v string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		return Dialect{}, fmt.Errorf("read clickhouse version: %w", err)
	}
	return ParseDialect(v)
}

// Migration is one versioned, idempotent step of the schema.
type Migration struct {
	Version int
	Name    string
	text    string
}

var migrationName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.sql", e.Name())
		}
		text, err := fs.ReadFile(migrationFiles, "migrations/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		v, _ := strconv.Atoi(m[1])
		ms = append(ms, Migration{Version: v, Name: m[2], text: string(text)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := range ms {
		if ms[i].Version != i+1 {
			return nil, fmt.Errorf("migration %04d_%s: versions must run 1, 2, 3... without gaps", ms[i].Version, ms[i].Name)
		}
	}
	return ms, nil
}

// rollup describes one usage_<name> table for the 0003 template.
type rollup struct {
	Name, Type, Bucket, Partition, TTLTime string
	Days                                   int
}

// Table is the rollup's table, usage_<name>.
func (r rollup) Table() Table { return Table("usage_" + r.Name) }

// Statements renders the migration for a database and dialect on one server and splits it
// into statements.
func (m Migration) Statements(db string, d Dialect) ([]string, error) {
	return m.Render(db, d, Layout{})
}

// Render renders the migration for a database, dialect and layout and splits it into
// statements. Besides the data below, the templates call
//
//	{{local "decisions"}}            the table holding the rows: db.decisions or db.decisions_local
//	{{.OnCluster}}                   " ON CLUSTER 'name'" on a cluster, else nothing
//	{{engine "MergeTree" "decisions"}} the engine: MergeTree or ReplicatedMergeTree(path, replica)
//	{{distributed "decisions"}}      on a cluster, the statement creating the Distributed table
//	{{dedupWindow}}                  the setting keeping 1000 insert blocks' hashes (modern dialect)
func (m Migration) Render(db string, d Dialect, l Layout) ([]string, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"local":       func(t Table) string { return db + "." + l.Storage(t) },
		"engine":      func(kind string, t Table) string { return l.engine(db, kind, t) },
		"distributed": func(t Table) string { return l.distributed(db, t) },
		"dedupWindow": l.dedupWindow,
	}
	tmpl, err := template.New(m.Name).Option("missingkey=error").Funcs(funcs).Parse(m.text)
	if err != nil {
		return nil, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
	}
	data := map[string]any{
		"DB":        db,
		"OnCluster": l.onCluster(),
		"Modern":    d.Modern,
		"String":    "String",
		"Time":      "DateTime",
		"State":     "Enum8('unspecified' = 0, 'normal' = 1, 'warning' = 2, 'throttled' = 3)",
		"Rollups": []rollup{
			{"minute", "DateTime", "toStartOfMinute(time)", "toDate(minute)", "minute", Retention(UsageMinute).Days},
			{"hour", "DateTime", "toStartOfHour(time)", "toYYYYMM(hour)", "hour", Retention(UsageHour).Days},
			{"day", "Date", "toDate(time)", "toYYYYMM(day)", "toDateTime(day)", Retention(UsageDay).Days},
		},
	}
	if d.Modern {
		data["String"] = "LowCardinality(String)"
		data["Time"] = "DateTime64(6, 'UTC')"
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		return nil, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
	}
	var stmts []string
	for _, s := range strings.Split(buf.String(), ";\n") {
		if s = stripComments(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts, nil
}

// stripComments drops whole-line -- comments and surrounding blank space.
func stripComments(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	return strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";")
}

// Migrate creates the database and applies the migrations not yet recorded in
// <db>.schema_migrations, in order, on one server. It is safe to run again and from several
// processes at once: they take turns (a lock table, lock.go), and every statement is IF NOT
// EXISTS (or, for a column the legacy dialect cannot add so, takes the column's existence for
// done), so that one interrupted is finished by the next. It returns the names of the migrations
// it applied.
func Migrate(ctx context.Context, conn driver.Conn, db string) (Dialect, []string, error) {
	return Layout{}.Migrate(ctx, conn, db)
}

// Migrate is the package's Migrate in the layout. On a cluster every statement runs ON
// CLUSTER: the server conn reaches queues it in ZooKeeper and waits, up to ctx's deadline, for
// every server of the cluster to run it, so migrate with all of them up (one that is down runs
// the queue when it comes back, and the next Migrate records what this one could not). Once
// every migration is recorded, Migrate runs no DDL at all, so an aggregator starting while a
// replica is down is not held up. A database migrated with the other layout is refused with
// an error wrapping ErrLayout.
func (l Layout) Migrate(ctx context.Context, conn driver.Conn, db string) (Dialect, []string, error) {
	return l.MigrateSteps(ctx, conn, db, nil)
}

// Step is a migration Migrate is about to apply: the Index-th (from 1) of the Pending ones.
type Step struct {
	Name           string // 0003_usage_views
	Index, Pending int
}

// MigrateSteps is Migrate, calling step (when not nil) before each migration it applies:
// quotaflow migrate shows them as progress.
func (l Layout) MigrateSteps(ctx context.Context, conn driver.Conn, db string, step func(Step)) (Dialect, []string, error) {
	if db == "" {
		db = DefaultDatabase
	}
	if !validIdent(db) {
		return Dialect{}, nil, fmt.Errorf("database %q: want letters, digits and underscores", db)
	}
	if err := l.Validate(); err != nil {
		return Dialect{}, nil, err
	}
	d, err := DetectDialect(ctx, conn)
	if err != nil {
		return Dialect{}, nil, err
	}
	ms, err := Migrations()
	if err != nil {
		return d, nil, err
	}
	if err := l.bootstrap(ctx, conn, db); err != nil {
		return d, nil, err
	}
	done, unlock, err := l.readDoneLocked(ctx, conn, db, len(ms))
	if err != nil {
		return d, nil, err
	}
	defer unlock()
	var applied []string
	pending := 0
	for _, m := range ms {
		if !done[uint32(m.Version)] {
			pending++
		}
	}
	for _, m := range ms {
		if done[uint32(m.Version)] {
			continue
		}
		if step != nil {
			step(Step{Name: fmt.Sprintf("%04d_%s", m.Version, m.Name), Index: len(applied) + 1, Pending: pending})
		}
		if err := l.apply(ctx, conn, db, d, m); err != nil {
			return d, applied, err
		}
		applied = append(applied, fmt.Sprintf("%04d_%s", m.Version, m.Name))
	}
	return d, applied, nil
}

// bootstrap creates the database and schema_migrations.
func (l Layout) bootstrap(ctx context.Context, conn driver.Conn, db string) error {
	exists, err := l.checkServer(ctx, conn, db)
	if err != nil {
		return err
	}
	// On one server the bootstrap always runs, as it always did; on a cluster only while the
	// table is missing here, as an ON CLUSTER statement waits for every server.
	if l.Replicated() && exists {
		return nil
	}
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS " + db + l.onCluster(), l.migrationsTable(db)} {
		if err := conn.Exec(l.ddlContext(ctx), q); err != nil {
			return fmt.Errorf("bootstrap schema_migrations: %w", err)
		}
	}
	return nil
}

// readDoneLocked reads the versions applied; when some of the n migrations are not, it takes
// the migration lock and reads them again under it. The caller calls unlock once it is done.
func (l Layout) readDoneLocked(ctx context.Context, conn driver.Conn, db string, n int) (done map[uint32]bool, unlock func(), err error) {
	done, err = readDone(ctx, conn, db)
	if err != nil || len(done) >= n {
		return done, func() {}, err
	}
	// Migrators take turns (lock.go): a migration that re-creates a view must not drop
	// the one another migrator made, while that one's aggregator already inserts.
	unlock, err = l.lock(ctx, conn, db)
	if err != nil {
		return nil, nil, err
	}
	if done, err = readDone(ctx, conn, db); err != nil {
		unlock()
		return nil, nil, err
	}
	return done, unlock, nil
}

// apply runs migration m's statements and records it in schema_migrations.
func (l Layout) apply(ctx context.Context, conn driver.Conn, db string, d Dialect, m Migration) error {
	stmts, err := m.Render(db, d, l)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if err := conn.Exec(l.ddlContext(ctx), s); err != nil && !columnExisted(d, s, err) {
			return fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".schema_migrations (version, name, dialect, server_version, applied_at)")
	if err != nil {
		return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
	}
	if err := b.Append(uint32(m.Version), m.Name, d.String(), d.Version, time.Now()); err != nil {
		b.Abort()
		return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
	}
	return nil
}

// readDone returns the versions recorded in db.schema_migrations.
func readDone(ctx context.Context, conn driver.Conn, db string) (map[uint32]bool, error) {
	done := map[uint32]bool{}
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM "+db+".schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		done[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return done, nil
}

// columnExisted reports whether err is the legacy dialect's refusal of an ADD COLUMN statement
// because a column exists: 18.16 has no ADD COLUMN IF NOT EXISTS, so a migration that adds
// columns (all of a table's in one atomic statement) takes this for done, and stays safe to run again and from
// several processes at once, as every other statement is.
func columnExisted(d Dialect, stmt string, err error) bool {
	return !d.Modern && strings.Contains(stmt, " ADD COLUMN ") && strings.Contains(err.Error(), "already exists")
}

var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func validIdent(s string) bool { return ident.MatchString(s) }
