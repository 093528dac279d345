package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/stream"
)

func runNATSAuth(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("nats-auth", `Writes the NATS credentials of quotaflow's roles into --dir, and the nats-server
configuration of their users:

  checker.nk     the checkers' (--nats-creds): publish decisions and health, read the rules
  aggregator.nk  the aggregators' (--nats-creds): consume decisions, publish warnings,
                 write the policies' overrides
  admin.nk       the admin API's (a checker's --nats-admin-creds): write the rules and overrides
  operator.nk    read-only (quotaflow watch, top, status, and services that follow warnings)
  nats-users.conf  the users and their permissions: include it in the server's configuration
                 (include ./nats-users.conf)

Each is an nkey seed, written 0600 in a folder of mode 0700; seeds already there are kept, so
running it again rewrites only nats-users.conf (after a change of --partitions, say). Without
the seed a process cannot connect, and with one it can do only what its role needs:
docs/security.md says what each still allows. quotaflow serve does the same for its embedded
server, under <--nats-dir>/auth.`, stderr)
	var dir string
	var cfg natsauth.Config
	fs.StringVar(&dir, "dir", "", "`folder` of the credentials (required)")
	fs.IntVar(&cfg.Partitions, "partitions", stream.Partitions, "partitions of the decision stream, as the checkers' --partitions: the aggregators' consumers, one per partition, are closed to the other roles")
	fs.fromEnv("partitions")
	fs.check(func() error {
		if dir == "" {
			return errors.New("--dir: required")
		}
		return fieldFlagErr(cfg.Validate(), nil)
	})
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	path, err := cfg.Write(dir)
	if err != nil {
		return err
	}
	for _, role := range natsauth.Roles {
		fmt.Fprintf(stdout, "%-10s %s\n", role, natsauth.SeedFile(dir, role))
	}
	fmt.Fprintf(stdout, "%-10s %s\n", "server", path)
	return nil
}
