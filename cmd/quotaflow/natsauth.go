package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/stream"
)

func runNATSAuth(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("nats-auth", help("nats-auth"), stderr)
	var dir string
	var cfg natsauth.Config
	fs.StringVar(&dir, "dir", "", "`folder` of the credentials (required)")
	fs.IntVar(&cfg.Partitions, "partitions", stream.Partitions, "partitions of the decision stream, as the checkers' --partitions: the aggregators' consumers, one per partition, are closed to the other roles")
	fs.FromEnv("partitions")
	fs.Check(func() error {
		if dir == "" {
			return errors.New("--dir: required")
		}
		return cli.FlagError(cfg.Validate(), nil)
	})
	if err := fs.Parse(args, getenv); err != nil {
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
