package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/loadgen"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/progress"
)

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("bench", help("bench"), stderr)
	var cfg loadgen.Config
	var asJSON bool
	fs.StringVar(&cfg.Target, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.FromEnv("target")
	fs.StringVar((*string)(&cfg.Protocol), "protocol", "connect", "`protocol`: connect (CheckRateLimit over Connect, HTTP/1.1), grpc (CheckRateLimit over gRPC, HTTP/2) rls (Envoy's ShouldRateLimit over gRPC) or gubernator (gubernator's GetRateLimits over gRPC, to compare with that peer)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "closed loop: `N` workers; open loop: at most N checks in flight")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop at `R` checks per second in total (0: closed loop)")
	fs.IntVar(&cfg.Batch, "batch", 1, fmt.Sprintf("`N` checks per RPC, sent as one CheckRateLimits (--protocol connect or grpc; at most %d); --concurrency then counts RPCs", loadgen.MaxBatch))
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to measure")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "load to send before measuring, not counted in the report")
	fs.IntVar(&cfg.Keys, "keys", 10000, fmt.Sprintf("number of distinct subjects (at most %d)", loadgen.MaxKeys))
	fs.StringVar((*string)(&cfg.Distribution), "distribution", "uniform", "how checks pick their subject, a `distribution`: uniform; zipf (Zipf s=1.1: subject n is picked in proportion to 1/(n+1)^1.1); hot (90% of checks go to 1% of the subjects)")
	fs.StringVar(&cfg.Endpoint, "endpoint", "/api/v1/orders", "`path` every check names as its endpoint")
	fs.StringVar(&cfg.Entitlement, "entitlement", "", "an entitlement's `id` every check names, whose balance it burns (connect, grpc)")
	fs.StringVar((*string)(&cfg.Dimension), "dimension", "user", "`dimension` of the subjects: user, ip or apikey")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "bench-", "subject identifiers are this `prefix` and a number")
	fs.StringVar(&cfg.Domain, "domain", "quotaflow", "RLS `domain` (--protocol rls)")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Second, "deadline of each check; one that misses it counts as an error")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object (checks_per_sec, p50_ms, p90_ms, p99_ms, p999_ms, allowed, denied, errors, degraded and more)")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	// Validate, not Run's checks: Run reads a flag set to 0 or "" as its default.
	if err := cfg.Validate(); err != nil {
		return benchFlagErr(err, cfg.Protocol)
	}
	line := progress.New(stderr)
	if line.On() {
		cfg.Progress = line
	}
	rep, err := loadgen.Run(ctx, cfg)
	line.Clear()
	if err != nil {
		// grpc-go rejects some URLs that Validate accepts.
		return benchFlagErr(err, cfg.Protocol)
	}
	if asJSON {
		return rep.WriteJSON(stdout)
	}
	// The text report's write error is dropped so that the exit status of a text run stays
	// what it always was (0 once the run is made); --json has always reported it.
	_ = rep.WriteText(stdout)
	return nil
}

// benchFlagErr makes a run's error a usage error, naming the flag of a loadgen.ConfigError:
// each is its field's name. A batch of a protocol without batches names both flags.
func benchFlagErr(err error, protocol loadgen.Protocol) error {
	if errors.Is(err, loadgen.ErrBatchProtocol) {
		return cli.Usagef("--batch: batches are CheckRateLimits calls, of --protocol connect or grpc, not %s", protocol)
	}
	return cli.Usage(cli.FlagError(err, nil))
}
