package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/backtest"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/progress"
)

func runBacktest(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("backtest", help("backtest"), stderr)
	var f backtestFlags
	f.register(fs)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	req, err := f.spec.Request(time.Now())
	if err != nil {
		return backtestFlagErr(err)
	}
	line := progress.New(stderr)
	if line.On() && !f.spec.Live {
		req.Progress = func(p backtest.Progress) { line.Printf("backtest: %s", p) }
	}
	// The replay's garbage is short-lived and its live heap small (bounded buckets): fewer
	// collections leave more of a core to the replay (measured: docs/backtest.md).
	debug.SetGCPercent(400)
	rep, err := f.run(ctx, req)
	line.Clear()
	if err != nil {
		return backtestFlagErr(err)
	}
	switch f.format {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case "csv":
		return rep.WriteCSV(stdout)
	}
	return rep.WriteTable(stdout)
}

// backtestFlagErr names the flag of a backtest's *field.Error: each names its flag already.
func backtestFlagErr(err error) error {
	if fe := (*field.Error)(nil); errors.As(err, &fe) {
		return cli.Usagef("--%s: %s", fe.Field, fe.Msg)
	}
	return err
}

// backtestFlags are backtest's flags: the history, the rules replayed, what is reported.
type backtestFlags struct {
	c         clickhouseFlags
	spec      backtest.Spec
	format    string
	inChecker bool
	bounds    backtest.Config
}

func (f *backtestFlags) register(fs *cli.FlagSet) {
	f.c.register(fs, "clickhouse://127.0.0.1:9000/quotaflow")
	fs.StringVar(&f.spec.RulesFile, "rules", "", "the rules `file` to replay the history under (required)")
	fs.StringVar(&f.spec.From, "from", "", "start of the history: an RFC 3339 `time`, or a duration before now (default 1h; with --live-candidates, the whole retained history)")
	fs.StringVar(&f.spec.To, "to", "0s", "end of the history (excluded): an RFC 3339 `time`, or a duration before now")
	fs.StringVar(&f.spec.Subject, "subject", "", "report only this `subject`'s checks, as the audit names it (user:alice, ip:10.0.0.1, api_key:k1)")
	fs.StringVar(&f.spec.Tier, "tier", "", "report only the checks of this `tier`")
	fs.StringVar(&f.spec.Rule, "rule", "", "report only the checks this `rule` (an id of the rules file) applied to")
	fs.IntVar(&f.spec.Top, "top", 10, "how many subjects to list (at most 1000)")
	fs.DurationVar(&f.spec.Warmup, "warmup", 0, "history replayed before --from, unreported (0: the longest window of the rules, at most 24h; negative: none)")
	fs.StringVar(&f.format, "format", "table", "output `format`: table, json or csv")
	fs.IntVar(&f.bounds.MaxRules, "max-rules", 0, "refuse a rules file of more rules (0: no bound; a checker's admin API allows 100)")
	fs.Int64Var(&f.bounds.MaxRecords, "max-records", 0, "refuse a history (with its warm-up) of more audit rows (0: no bound; a checker's admin API allows 500,000)")
	fs.IntVar(&f.bounds.MaxBuckets, "max-buckets", 0, "most buckets the replay holds at once, the expired going first (0: 4Mi; a checker's admin API 256Ki)")
	fs.BoolVar(&f.inChecker, "checker-bounds", false, "apply the bounds of a checker's admin API (100 rules, 500,000 rows, 256Ki buckets, 32 MiB of plans): what POST /api/v1/rules:backtest would run, and at what memory")
	fs.Check(func() error {
		if f.format != "table" && f.format != "json" && f.format != "csv" {
			return fmt.Errorf("--format: %q is not table, json or csv", f.format)
		}
		return nil
	})
	fs.BoolVar(&f.spec.Live, "live-candidates", false, "compare the candidate rules' recorded answers with their live rules' instead of replaying (--rules optional, to check --rule and --tier)")
}

// run connects to ClickHouse and runs req: a replay, or with --live-candidates a comparison.
func (f *backtestFlags) run(ctx context.Context, req backtest.Request) (*backtest.Report, error) {
	conn, db, err := f.c.open()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	bounds := f.bounds
	if f.inChecker {
		bounds = backtest.InChecker
	}
	bounds.Conn, bounds.Database, bounds.Logger = conn, db, slog.New(slog.DiscardHandler)
	bt := backtest.New(bounds)
	if f.spec.Live {
		return bt.LiveCandidates(ctx, req)
	}
	return bt.Run(ctx, req)
}
