// Package daemontest starts quotaflow's daemons in a test's process from their config, the
// one way tests run a checker or an aggregator in process, and stops them when the test ends.
// (A checker a test must kill -9 runs as a child process instead: see cmd/quotaflow.)
package daemontest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// startTimeout bounds a daemon's start and its first ready answer: a NATS cluster electing its
// leaders on a loaded machine takes seconds.
const startTimeout = 30 * time.Second

// Logger is the daemons' logger in tests: discarded, unless QF_DEBUG is set.
func Logger() *slog.Logger {
	if os.Getenv("QF_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Checker starts a checker from cfg and waits until its /readyz answers 200; one still running
// when the test ends is closed then, and a failure of that Close fails the test. Unset, Listen is a free port,
// RedisTimeout 5s (a loaded machine must not degrade checks), the spool a temporary folder
// and the logger Logger().
func Checker(t testing.TB, cfg daemon.CheckerConfig) *daemon.Checker {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = 5 * time.Second
	}
	if cfg.Publisher.SpoolDir == "" {
		cfg.Publisher.SpoolDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	d, err := daemon.StartChecker(ctx, cfg)
	if err != nil {
		t.Fatalf("start checker: %v", err)
	}
	t.Cleanup(func() { closeAtEnd(t, "checker", d) })
	if err := poll.Wait(ctx, d.URL()+" ready", ready(t, d.URL(), d.Done())); err != nil {
		t.Fatalf("not within %s: %v", startTimeout, err)
	}
	return d
}

// Aggregator starts an aggregator from cfg; one still running when the test ends is closed
// then, and a failure of that Close fails the test. Unset, the logger is Logger().
func Aggregator(t testing.TB, cfg daemon.AggregatorConfig) *daemon.Aggregator {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Logger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	d, err := daemon.StartAggregator(ctx, cfg)
	if err != nil {
		t.Fatalf("start aggregator: %v", err)
	}
	t.Cleanup(func() { closeAtEnd(t, "aggregator", d) })
	return d
}

// closeAtEnd closes a daemon the test left running and fails the test if that fails. A
// daemon already stopped is the test's to judge: it closed it and saw what Close returned.
func closeAtEnd(t testing.TB, what string, d interface {
	Done() <-chan struct{}
	Close() error
}) {
	select {
	case <-d.Done():
		return
	default:
	}
	if err := d.Close(); err != nil {
		t.Errorf("close %s: %v", what, err)
	}
}

// ready is the condition that base's /readyz answers 200; it fails the test when the daemon
// stops (done) first.
func ready(t testing.TB, base string, done <-chan struct{}) func(context.Context) error {
	hc := &http.Client{Timeout: time.Second}
	return func(ctx context.Context) error {
		resp, err := hc.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: %s", resp.Status)
		}
		select {
		case <-done:
			t.Fatalf("%s stopped before it was ready", base)
		default:
		}
		return err
	}
}
