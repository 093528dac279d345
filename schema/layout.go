package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Layout is how quotaflow's tables are laid out: on one server (the zero Layout, the default)
// or replicated over a ClickHouse cluster (OnCluster).
//
// On a cluster every table that holds rows is a Replicated*MergeTree named <table>_local,
// created ON CLUSTER on every server with the ZooKeeper path
// /clickhouse/tables/{shard}/<database>/<table>_local and the replica name {replica}, both
// macros of each server's config; the materialized views read and fill the local tables; and
// a Distributed table under the table's usual name (decisions, usage_hour, ...) reads all of
// them. So queries, the analysts' and the aggregator's lookups alike, keep their table names,
// while inserts go to the local tables of the server they reach (Storage), from which
// ZooKeeper replicates them to the shard's other replicas. schema_migrations is one
// replicated table over the whole cluster, so that every server knows what was applied.
type Layout struct {
	// Cluster names the cluster in the servers' remote_servers; empty means one server.
	Cluster string
}

// OnCluster returns the layout replicated over the named cluster; "" is the single-server
// layout.
func OnCluster(cluster string) Layout { return Layout{Cluster: cluster} }

// Replicated reports whether the layout is the cluster's.
func (l Layout) Replicated() bool { return l.Cluster != "" }

// Storage returns the name of the table that holds t's rows, the one to insert into: t itself
// on one server, t_local on a cluster (t being the Distributed table that reads them all).
func (l Layout) Storage(t Table) string {
	if l.Replicated() {
		return string(t) + "_local"
	}
	return string(t)
}

// String names the layout for logs.
func (l Layout) String() string {
	if l.Replicated() {
		return "cluster " + l.Cluster
	}
	return "single server"
}

// ErrLayout is wrapped by the errors of Migrate and ApplyRetention that come from a layout
// that does not fit the server or the database: a cluster the server does not define, or a
// database migrated with the other layout.
var ErrLayout = errors.New("schema layout")

// clusterName limits cluster names to what remote_servers' XML element names commonly hold;
// the name is quoted as a string literal wherever the SQL names it.
var clusterName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// Validate checks the cluster's name, which the SQL quotes as a string literal.
func (l Layout) Validate() error {
	if l.Replicated() && !clusterName.MatchString(l.Cluster) {
		return fmt.Errorf("%w: cluster %q: want letters, digits, '_', '-' and '.'", ErrLayout, l.Cluster)
	}
	return nil
}

// onCluster is the ON CLUSTER clause of a DDL statement, with its leading space; empty on one
// server.
func (l Layout) onCluster() string {
	if !l.Replicated() {
		return ""
	}
	return " ON CLUSTER '" + l.Cluster + "'"
}

// engine is the engine clause of a table holding rows: kind (MergeTree, SummingMergeTree) on
// one server, its Replicated variant on a cluster. The macros let one ON CLUSTER statement
// name each server's own shard and replica; the database is in the path so that two
// databases on one cluster never share a ZooKeeper node.
func (l Layout) engine(db, kind string, t Table) string {
	if !l.Replicated() {
		return kind
	}
	return fmt.Sprintf("Replicated%s('/clickhouse/tables/{shard}/%s/%s', '{replica}')", kind, db, l.Storage(t))
}

// distributed is the statement creating t's Distributed table over its local tables, with its
// leading newline and closing semicolon; empty on one server. Its sharding key only matters
// to whoever inserts through it (quotaflow never does): rand() spreads such rows evenly.
func (l Layout) distributed(db string, t Table) string {
	if !l.Replicated() {
		return ""
	}
	return fmt.Sprintf("\nCREATE TABLE IF NOT EXISTS %[1]s.%[2]s%[3]s AS %[1]s.%[4]s\nENGINE = Distributed('%[5]s', '%[1]s', '%[4]s', rand());\n",
		db, t, l.onCluster(), l.Storage(t), l.Cluster)
}

// dedupWindow is the table setting that keeps the last 1000 insert blocks' hashes, so that a
// retried insert (the same rows, or the same insert_deduplication_token) is dropped: a
// MergeTree keeps none by default, a ReplicatedMergeTree 100 (1000 on newer servers).
func (l Layout) dedupWindow() string {
	if l.Replicated() {
		return "replicated_deduplication_window = 1000"
	}
	return "non_replicated_deduplication_window = 1000"
}

// migrationsTable is the CREATE statement of schema_migrations. On a cluster it is a single
// replicated table over every shard (no {shard} in its path, both macros in the replica's
// name so that it is unique cluster-wide), so that a migration recorded through one server is
// seen through all.
func (l Layout) migrationsTable(db string) string {
	engine := "MergeTree"
	if l.Replicated() {
		engine = fmt.Sprintf("ReplicatedMergeTree('/clickhouse/tables/all/%s/schema_migrations', '{shard}-{replica}')", db)
	}
	return "CREATE TABLE IF NOT EXISTS " + db + ".schema_migrations" + l.onCluster() +
		" (version UInt32, name String, dialect String, server_version String, applied_at DateTime) ENGINE = " + engine + " ORDER BY version"
}

// checkServer makes sure the server can hold the layout and that db, if it exists, was
// migrated with it. It returns whether db.schema_migrations exists.
func (l Layout) checkServer(ctx context.Context, conn driver.Conn, db string) (bool, error) {
	if l.Replicated() {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.clusters WHERE cluster = ?", l.Cluster).Scan(&n); err != nil {
			return false, fmt.Errorf("read system.clusters: %w", err)
		}
		if n == 0 {
			return false, fmt.Errorf("%w: cluster %q is not in the server's remote_servers", ErrLayout, l.Cluster)
		}
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.macros WHERE macro IN ('shard', 'replica')").Scan(&n); err != nil {
			return false, fmt.Errorf("read system.macros: %w", err)
		}
		if n != 2 {
			return false, fmt.Errorf("%w: cluster %q: the server's config must define the macros shard and replica", ErrLayout, l.Cluster)
		}
	}
	var engine string
	err := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'schema_migrations'", db).Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read system.tables: %w", err)
	}
	switch replicated := strings.HasPrefix(engine, "Replicated"); {
	case replicated && !l.Replicated():
		var full string
		_ = conn.QueryRow(ctx, "SELECT engine_full FROM system.tables WHERE database = ? AND name = 'decisions'", db).Scan(&full)
		return true, fmt.Errorf("%w: database %s holds the replicated schema (decisions: %s): name its cluster (--clickhouse-cluster)", ErrLayout, db, full)
	case !replicated && l.Replicated():
		return true, fmt.Errorf("%w: database %s holds the single-server schema; it cannot be migrated onto cluster %q (docs/clickhouse-cluster.md)", ErrLayout, db, l.Cluster)
	}
	return true, nil
}

// ddlContext bounds how long a server waits for the other servers of the cluster to run an ON
// CLUSTER statement (distributed_ddl_task_timeout, 180s by default) by ctx's deadline, so that
// the server gives up when the caller does. A server that is down runs the statement from the
// queue in ZooKeeper when it comes back.
func (l Layout) ddlContext(ctx context.Context) context.Context {
	deadline, ok := ctx.Deadline()
	if !l.Replicated() || !ok {
		return ctx
	}
	secs := max(1, int(time.Until(deadline).Seconds()))
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": secs}))
}
