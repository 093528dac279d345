package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/publisher"
)

// publishFlags configure the decision stream of the commands that run a checker.
type publishFlags struct {
	natsURL       string
	spoolDir      string
	spoolMaxBytes int64
	partitions    int
	replicas      int
	maxAge        time.Duration
	dupWindow     time.Duration
	batch         int
	flush         time.Duration
	natsTLS       clientTLSFlags
}

func (p *publishFlags) register(fs *flagSet, defaultSpool string) {
	fs.StringVar(&p.natsURL, "nats-url", "", "NATS `URL` for the decision stream; empty: decisions are not published")
	p.natsTLS.register(fs, "nats", "NATS")
	fs.StringVar(&p.spoolDir, "spool-dir", defaultSpool, "`folder` of the on-disk spool that keeps decisions while NATS is unreachable")
	fs.Int64Var(&p.spoolMaxBytes, "spool-max-bytes", 1<<30, "size bound of the spool; past it decisions are dropped, loudly")
	fs.IntVar(&p.partitions, "partitions", stream.Partitions, "partitions of the decision stream (subjects quotaflow.decisions.<n>); the same on every checker")
	fs.IntVar(&p.replicas, "stream-replicas", 1, "replicas of every stream and bucket quotaflow creates in NATS (decisions, events, rule store); at most the servers of the NATS cluster, 1 for a server outside a cluster; the same on every checker and aggregator")
	fs.DurationVar(&p.maxAge, "stream-max-age", 72*time.Hour, "how long the stream keeps decisions: the buffer for a downstream outage")
	fs.DurationVar(&p.dupWindow, "stream-duplicate-window", 2*time.Minute, "window in which the stream drops a re-published batch (each id held costs the server ~100 bytes)")
	fs.IntVar(&p.batch, "publish-batch", 512, "most decisions in one message")
	fs.DurationVar(&p.flush, "publish-flush", 5*time.Millisecond, "longest a decision waits for its batch, and the spool's flush interval")
	fs.fromEnv("nats-url", "spool-dir", "spool-max-bytes", "partitions", "stream-replicas",
		"stream-max-age", "stream-duplicate-window", "publish-batch", "publish-flush")
}

func (p *publishFlags) validate() error {
	switch {
	case p.natsURL != "" && !strings.HasPrefix(p.natsURL, "nats://") && !strings.HasPrefix(p.natsURL, "tls://"):
		return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", p.natsURL)
	case p.partitions < 1 || p.partitions > stream.MaxPartitions:
		return fmt.Errorf("--partitions: want 1 to %d, got %d", stream.MaxPartitions, p.partitions)
	case p.replicas < 1 || p.replicas > 5:
		return fmt.Errorf("--stream-replicas: want 1 to 5, got %d", p.replicas)
	case p.dupWindow <= 0 || p.dupWindow > p.maxAge:
		return fmt.Errorf("--stream-duplicate-window: want more than 0 and at most --stream-max-age (%s), got %s", p.maxAge, p.dupWindow)
	case p.batch < 1:
		return fmt.Errorf("--publish-batch: want at least 1, got %d", p.batch)
	case p.flush < time.Millisecond:
		return fmt.Errorf("--publish-flush: want at least 1ms, got %s", p.flush)
	case p.spoolMaxBytes < 1<<20:
		return fmt.Errorf("--spool-max-bytes: want at least 1 MiB, got %d", p.spoolMaxBytes)
	case p.spoolDir == "":
		return errors.New("--spool-dir: required with --nats-url")
	}
	return nil
}

func (p *publishFlags) config(instanceID string, log *slog.Logger) publisher.Config {
	return publisher.Config{
		Partitions:      p.partitions,
		Replicas:        p.replicas,
		MaxAge:          p.maxAge,
		DuplicateWindow: p.dupWindow,
		MaxBatch:        p.batch,
		FlushInterval:   p.flush,
		SpoolDir:        p.spoolDir,
		SpoolMaxBytes:   p.spoolMaxBytes,
		InstanceID:      instanceID,
		Logger:          log,
	}
}

// replicasFlag names --stream-replicas in an error about replicas the NATS servers cannot hold,
// and makes it a usage error.
func replicasFlag(err error) error {
	var re *broker.ReplicasError
	if errors.As(err, &re) {
		return usageError{fmt.Errorf("--stream-replicas: %w", err)}
	}
	return err
}

// closePublisher drains the publisher within timeout: the queue and the spool go to NATS;
// what cannot stays in the spool for the next start.
func closePublisher(pub *publisher.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := pub.Close(ctx); err != nil {
		return fmt.Errorf("drain decisions: %w", err)
	}
	return nil
}
