package main

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/dashboard"
	"github.com/quotaflow/quotaflow/internal/cli"
)

func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("top", help("top"), stderr)
	var cfg dashboard.TopConfig
	fs.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "how often the screen is redrawn")
	fs.DurationVar(&cfg.Window, "window", 10*time.Second, "the sliding window the subjects' checks are counted over (whole seconds)")
	fs.DurationVar(&cfg.Since, "since", time.Hour, "how far back warning transitions are read to know who is throttled now")
	fs.IntVar(&cfg.Rows, "rows", 20, "most subjects and throttles listed (fewer when the terminal is shorter)")
	fs.FromEnv("nats-url")
	registerReaderCreds(fs, &cfg.Credentials)
	fs.Check(func() error { return cli.FlagError(cfg.Validate(), natsURLFlag) })
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	return dashboard.Top(ctx, cfg, stdout, os.Stdin)
}
