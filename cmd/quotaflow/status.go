package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/dashboard"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// unhealthyError is a status that found a dependency down or no process reporting (exit
// status 4): a script or a probe tells it from a status that could not be asked (1).
type unhealthyError struct{ problems []string }

func (e unhealthyError) Error() string { return "unhealthy: " + strings.Join(e.problems, "; ") }

func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("status", help("status"), stderr)
	var cfg dashboard.StatusConfig
	var format string
	var timeout time.Duration
	fs.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL` the processes report to")
	fs.StringVar(&format, "format", "text", "`format`: text (one screen) or json")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for NATS")
	fs.FromEnv("nats-url")
	registerReaderCreds(fs, &cfg.Credentials)
	fs.Check(func() error {
		switch {
		case format != "text" && format != "json":
			return fmt.Errorf("--format: want text or json, got %q", format)
		case timeout <= 0:
			return fmt.Errorf("--timeout: want more than 0, got %s", timeout)
		case !broker.IsURL(cfg.NATSURL):
			return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", cfg.NATSURL)
		}
		return nil
	})
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := dashboard.ReadStatus(ctx, cfg)
	if err != nil {
		return err
	}
	write := st.Write
	if format == "json" {
		write = st.WriteJSON
	}
	if err := write(stdout); err != nil {
		return err
	}
	if len(st.Problems) > 0 {
		// A dependency down or no process reporting: a script or a probe tells it (4) from a
		// status that could not be asked (1).
		return cli.Status{Code: 4, Err: errors.New("unhealthy: " + strings.Join(st.Problems, "; "))}
	}
	return nil
}
