package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/progress"
	"github.com/quotaflow/quotaflow/schema"
)

// clickhouseFlags name the ClickHouse server, database and layout: the flags `migrate` and
// the aggregator (also under `serve`) share.
type clickhouseFlags struct {
	dsn     string
	cluster string
	tls     clientTLSFlags
}

func (c *clickhouseFlags) register(fs *cli.FlagSet, def string) {
	fs.StringVar(&c.dsn, "clickhouse-dsn", def, "ClickHouse native-protocol `DSN`, clickhouse://user:password@host:9000/database (database default: quotaflow; ?secure=true for TLS)")
	fs.StringVar(&c.cluster, "clickhouse-cluster", "", "ClickHouse `cluster` (a name in the servers' remote_servers) to lay the schema out on: replicated tables, ON CLUSTER migrations, Distributed tables for reads (docs/clickhouse-cluster.md); empty: one server. The same for migrate and every aggregator")
	fs.FromEnv("clickhouse-dsn", "clickhouse-cluster")
	fs.Check(func() error {
		if err := c.layout().Validate(); err != nil {
			return fmt.Errorf("--clickhouse-cluster: %w", err)
		}
		return nil
	})
	c.tls.register(fs, "clickhouse", "ClickHouse")
}

// layout is the schema's layout the flags name.
func (c *clickhouseFlags) layout() schema.Layout { return schema.OnCluster(c.cluster) }

// open connects to the server and returns the database the DSN names; a bad DSN is a usage
// error naming the flag.
func (c *clickhouseFlags) open() (driver.Conn, string, error) {
	tlsCfg, err := c.tls.config("")
	if err != nil {
		return nil, "", cli.Usage(err)
	}
	conn, db, err := schema.Open(c.dsn, tlsCfg)
	if de := (*schema.DSNError)(nil); errors.As(err, &de) {
		return nil, "", cli.Usagef("--clickhouse-dsn: %w", err)
	}
	return conn, db, err
}

// migrateTimeout bounds `quotaflow migrate`; on a cluster it is also how long a server waits
// for the others to run each ON CLUSTER statement.
const migrateTimeout = time.Minute

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("migrate", help("migrate"), stderr)
	var c clickhouseFlags
	c.register(fs, "clickhouse://127.0.0.1:9000/quotaflow")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	conn, db, err := c.open()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	line := progress.New(stderr)
	d, applied, err := c.layout().MigrateSteps(ctx, conn, db, func(s schema.Step) {
		line.Printf("migrate: %d/%d %s", s.Index, s.Pending, s.Name)
	})
	line.Clear()
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, report.Migrated(d, db, c.cluster, applied))
	return nil
}
