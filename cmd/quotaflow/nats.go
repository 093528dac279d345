package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/schema"
)

// checkCreds refuses a credentials file that cannot be read or is not one, naming its flag.
func checkCreds(flag, path string) error {
	if path == "" {
		return nil
	}
	if _, err := broker.CredentialsOption(path); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	return nil
}

// registerReaderCreds adds --nats-creds to a command that only reads NATS (watch, top,
// status): the operator role's credentials. Its default is the operator's seed of `make dev`
// (the embedded server's, under .dev/nats/auth) when that file exists, so that the tour's
// commands need no flag.
func registerReaderCreds(fs *cli.FlagSet, creds *string) {
	def := ""
	if dev := natsauth.SeedFile(filepath.Join(".dev", "nats", "auth"), natsauth.Operator); fileExists(dev) {
		def = dev
	}
	fs.StringVar(creds, "nats-creds", def, "NATS credentials `file`: the operator role's (read-only), an nkey seed or a user JWT .creds file")
	fs.FromEnv("nats-creds")
	fs.Check(func() error { return checkCreds("nats-creds", *creds) })
}

// fileExists reports whether path names a file.
func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// flagErr names the flag of a start-up error that one flag caused, and makes it a usage
// error: replicas the NATS servers cannot hold, a DSN the ClickHouse driver refuses.
func flagErr(err error) error {
	if re := (*broker.ReplicasError)(nil); errors.As(err, &re) {
		return cli.Usagef("--stream-replicas: %w", err)
	}
	if de := (*schema.DSNError)(nil); errors.As(err, &de) {
		return cli.Usagef("--clickhouse-dsn: %w", err)
	}
	return err
}

// natsURLFlag names the flag of a NATSURL field (fieldFlagErr), which kebab case would not.
var natsURLFlag = map[string]string{"NATSURL": "nats-url"}

// registerPublish adds the flags of the decision stream and its NATS: the commands that run a
// checker publish its decisions.
func (c *checkerFlags) registerPublish(fs *cli.FlagSet, defaultSpool string) {
	p := &c.cfg.Publisher
	fs.StringVar(&c.cfg.NATSURL, "nats-url", "", "NATS `URL` for the decision stream; empty: decisions are not published")
	c.natsTLS.register(fs, "nats", "NATS")
	fs.StringVar(&c.cfg.NATSCredentials, "nats-creds", "", "NATS credentials `file` of the checker role (an nkey seed, or a user JWT .creds file; `quotaflow nats-auth` writes them): publishes decisions and health, reads the rule store")
	fs.StringVar(&c.cfg.NATSAdminCredentials, "nats-admin-creds", "", "NATS credentials `file` of the admin role, with which the admin API writes the rule store and seeds it when empty; with --nats-creds and without it the rule store is read-only here")
	fs.StringVar(&p.SpoolDir, "spool-dir", defaultSpool, "`folder` of the on-disk spool that keeps decisions while NATS is unreachable")
	fs.Int64Var(&p.SpoolMaxBytes, "spool-max-bytes", 1<<30, "size bound of the spool; past it decisions are dropped, loudly")
	fs.IntVar(&p.Partitions, "partitions", stream.Partitions, "partitions of the decision stream (subjects quotaflow.decisions.<n>); the same on every checker")
	fs.IntVar(&p.Replicas, "stream-replicas", 1, "replicas of every stream and bucket quotaflow creates in NATS (decisions, events, rule store); at most the servers of the NATS cluster, 1 for a server outside a cluster; the same on every checker and aggregator")
	fs.DurationVar(&p.MaxAge, "stream-max-age", 72*time.Hour, "how long the stream keeps decisions: the buffer for a downstream outage")
	fs.DurationVar(&p.DuplicateWindow, "stream-duplicate-window", 2*time.Minute, "window in which the stream drops a re-published batch (each id held costs the server ~100 bytes)")
	fs.IntVar(&p.MaxBatch, "publish-batch", 512, "most decisions in one message")
	fs.DurationVar(&p.FlushInterval, "publish-flush", 5*time.Millisecond, "longest a decision waits for its batch, and the spool's flush interval")
	fs.DurationVar(&p.SpoolWait, "spool-wait", 100*time.Millisecond, "longest a check waits for its decision's write to the spool, which makes it survive a kill -9; past it the check is answered anyway and counted. 0: answer at once, and a kill -9 loses the last few ms of answered decisions")
	fs.FromEnv("nats-url", "nats-creds", "nats-admin-creds", "spool-dir", "spool-max-bytes", "partitions", "stream-replicas",
		"stream-max-age", "stream-duplicate-window", "publish-batch", "publish-flush", "spool-wait")
}
