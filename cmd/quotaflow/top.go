package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/app/dashboard"
)

// topOptions are top's flags.
type topOptions struct {
	natsURL, creds   string
	interval, window time.Duration
	since            time.Duration
	rows             int
}

func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", `A live terminal view for operators on a server without a browser: the busiest subjects over
the last --window (checks per second, allowed and denied), from the decision stream, and the
subjects warned or throttled now, from the warning transitions of the events stream (read
back --since to know the current ones). The screen is redrawn every --interval; q or Ctrl-C
quits and gives the terminal back as it was. Reads both streams with ephemeral ordered
consumers, so it changes nothing on the server.

When stdout is not a terminal (a pipe, a file), it prints one snapshot after the first
--interval and exits, so that top | mail or a cron job gets plain text.`, stderr)
	var o topOptions
	fs.StringVar(&o.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.DurationVar(&o.interval, "interval", time.Second, "how often the screen is redrawn")
	fs.DurationVar(&o.window, "window", 10*time.Second, "the sliding window the subjects' checks are counted over (whole seconds)")
	fs.DurationVar(&o.since, "since", time.Hour, "how far back warning transitions are read to know who is throttled now")
	fs.IntVar(&o.rows, "rows", 20, "most subjects and throttles listed (fewer when the terminal is shorter)")
	fs.fromEnv("nats-url")
	registerReaderCreds(fs, &o.creds)
	fs.check(o.validate)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	nc, err := readerConn(o.natsURL, "quotaflow top", o.creds)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	cfg := dashboard.TopConfig{Interval: o.interval, Window: o.window, Since: o.since, Rows: o.rows}
	return dashboard.Top(ctx, js, cfg, stdout, os.Stdin)
}

func (o *topOptions) validate() error {
	switch {
	case o.interval < 10*time.Millisecond:
		return fmt.Errorf("--interval: want at least 10ms, got %s", o.interval)
	case o.window < time.Second || o.window%time.Second != 0:
		return fmt.Errorf("--window: want whole seconds, at least 1s, got %s", o.window)
	case o.since < 0:
		return fmt.Errorf("--since: want 0 or more, got %s", o.since)
	case o.rows < 1:
		return fmt.Errorf("--rows: want at least 1, got %d", o.rows)
	case !strings.HasPrefix(o.natsURL, "nats://") && !strings.HasPrefix(o.natsURL, "tls://"):
		return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", o.natsURL)
	}
	return nil
}
