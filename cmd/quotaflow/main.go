// Command quotaflow runs quotaflow's services and talks to them.
//
// Usage:
//
//	quotaflow <command> [flags]
//
// Run `quotaflow help` for the commands and `quotaflow <command> --help` for their flags.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/instance"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.ExitCode(err, os.Stderr))
}

// program is quotaflow's commands.
func program() cli.Program {
	return cli.Program{Usage: help("quotaflow"), Commands: []cli.Command{
		{Name: "serve", Summary: "run the pipeline for development: checker, publisher and an embedded NATS", Run: runServe},
		{Name: "checker", Summary: "serve the check API (Connect, gRPC, gRPC-Web, HTTP forward-auth) on one port", Run: runChecker},
		{Name: "aggregator", Summary: "consume the decision stream into ClickHouse (audit and usage rollups), exactly once", Run: runAggregator},
		{Name: "migrate", Summary: "apply the ClickHouse schema migrations", Run: runMigrate},
		{Name: "nats-auth", Summary: "write the NATS credentials of each role and the server's users file", Run: runNATSAuth},
		{Name: "backtest", Summary: "replay the decision audit through a rules file: which answers would change", Run: runBacktest},
		{Name: "check", Summary: "ask a checker whether a request may go ahead", Run: runCheck},
		{Name: "settle", Summary: "settle or cancel a reservation made with quotaflow check --estimate", Run: runSettle},
		{Name: "release", Summary: "release (or renew) a concurrency lease an allowed check printed", Run: runRelease},
		{Name: "status", Summary: "one screen: every process's view of Redis, NATS and ClickHouse, lag, overrides, fail modes", Run: runStatus},
		{Name: "top", Summary: "a live terminal view of the busiest subjects and the current throttles", Run: runTop},
		{Name: "watch", Summary: "print a live stream: quotaflow watch decisions|warnings|overrides|config|entitlements", Run: runWatch},
		{Name: "bench", Summary: "put load on a checker and report checks/s and latency percentiles", Run: runBench},
		{Name: "rules", Summary: "list, get, apply -f or delete the rules of the rule store (admin API)", Run: rulesGroup.Run},
		{Name: "override", Summary: "set, list or delete temporary limit overrides (admin API)", Run: overrideGroup.Run},
		{Name: "exemption", Summary: "set, list or delete exemptions of trusted subjects from rules (admin API)", Run: exemptionGroup.Run},
		{Name: "tier", Summary: "set a user's tier: quotaflow tier set USER TIER (admin API)", Run: tierGroup.Run},
		{Name: "grant", Summary: "add, list or void grants of entitlements' balances (admin API)", Run: grantGroup.Run},
		{Name: "webhook", Summary: "set, list or delete webhook endpoints, and read their deliveries (admin API)", Run: webhookGroup.Run},
	}, Version: instance.Build()}
}

// run is the whole program: main only adds the process's signals, arguments and exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return program().Run(ctx, args, getenv, stdout, stderr)
}
