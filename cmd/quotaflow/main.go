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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the pipeline for development: checker, publisher and an embedded NATS", runServe},
		{"checker", "serve the check API (Connect, gRPC, gRPC-Web, HTTP forward-auth) on one port", runChecker},
		{"aggregator", "consume the decision stream into ClickHouse (audit and usage rollups), exactly once", runAggregator},
		{"migrate", "apply the ClickHouse schema migrations", runMigrate},
		{"nats-auth", "write the NATS credentials of each role and the server's users file", runNATSAuth},
		{"backtest", "replay the decision audit through a rules file: which answers would change", runBacktest},
		{"check", "ask a checker whether a request may go ahead", runCheck},
		{"settle", "settle or cancel a reservation made with quotaflow check --estimate", runSettle},
		{"release", "release (or renew) a concurrency lease an allowed check printed", runRelease},
		{"status", "one screen: every process's view of Redis, NATS and ClickHouse, lag, overrides, fail modes", runStatus},
		{"top", "a live terminal view of the busiest subjects and the current throttles", runTop},
		{"watch", "print a live stream: quotaflow watch decisions|warnings|overrides|config", runWatch},
		{"bench", "put load on a checker and report checks/s and latency percentiles", runBench},
		{"rules", "list, get, apply -f or delete the rules of the rule store (admin API)", runRules},
		{"override", "set, list or delete temporary limit overrides (admin API)", runOverride},
		{"exemption", "set, list or delete exemptions of trusted subjects from rules (admin API)", runExemption},
		{"tier", "set a user's tier: quotaflow tier set USER TIER (admin API)", runTier},
		{"version", "print quotaflow's version (also quotaflow --version)", runVersion},
	}
}

// isHelp reports whether arg asks for help rather than naming a command.
func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
}

// run is the whole program: main only adds the process's signals, arguments and exit status.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		return runVersion(ctx, args[1:], getenv, stdout, stderr)
	}
	if len(args) == 0 || isHelp(args[0]) {
		// help <command> is <command> --help; help help (or help --help) is this help, not
		// a question asked again of run.
		if len(args) > 1 && !isHelp(args[1]) {
			return run(ctx, []string{args[1], "--help"}, getenv, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return usageError{errors.New("no command given")}
		}
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], getenv, stdout, stderr)
		}
	}
	usage(stderr)
	return usageError{fmt.Errorf("unknown command %q", args[0])}
}

func usage(w io.Writer) {
	head, tail, _ := strings.Cut(help("quotaflow")+"\n", "{{commands}}\n")
	fmt.Fprint(w, head)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, tail)
}

// usageError is a command line that could not be understood (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCode maps run's error to the process's exit status and reports it.
func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	var de deniedError
	var he unhealthyError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &de):
		return 3
	case errors.As(err, &he):
		fmt.Fprintln(stderr, "quotaflow:", err)
		return 4
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "quotaflow:", err)
		return 2
	}
	fmt.Fprintln(stderr, "quotaflow:", err)
	return 1
}
