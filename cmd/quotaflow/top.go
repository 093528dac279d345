package main

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/dashboard"
)

func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", `A live terminal view for operators on a server without a browser: the busiest subjects over
the last --window (checks per second, allowed and denied), from the decision stream, and the
subjects warned or throttled now, from the warning transitions of the events stream (read
back --since to know the current ones). The screen is redrawn every --interval; q or Ctrl-C
quits and gives the terminal back as it was. Reads both streams with ephemeral ordered
consumers, so it changes nothing on the server.

When stdout is not a terminal (a pipe, a file), it prints one snapshot after the first
--interval and exits, so that top | mail or a cron job gets plain text.`, stderr)
	var cfg dashboard.TopConfig
	fs.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "how often the screen is redrawn")
	fs.DurationVar(&cfg.Window, "window", 10*time.Second, "the sliding window the subjects' checks are counted over (whole seconds)")
	fs.DurationVar(&cfg.Since, "since", time.Hour, "how far back warning transitions are read to know who is throttled now")
	fs.IntVar(&cfg.Rows, "rows", 20, "most subjects and throttles listed (fewer when the terminal is shorter)")
	fs.fromEnv("nats-url")
	registerReaderCreds(fs, &cfg.Credentials)
	fs.check(func() error { return fieldFlagErr(cfg.Validate(), natsURLFlag) })
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	return dashboard.Top(ctx, cfg, stdout, os.Stdin)
}
