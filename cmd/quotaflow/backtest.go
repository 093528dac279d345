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

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/backtest"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/progress"
)

func runBacktest(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("backtest", help("backtest"), stderr)
	var f backtestFlags
	f.register(fs)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	req, err := f.request(time.Now())
	if err != nil {
		return usageError{err}
	}
	line := progress.New(stderr)
	if line.On() && !f.live {
		req.Progress = func(p backtest.Progress) { line.Printf("backtest: %s", p) }
	}
	// The replay's garbage is short-lived and its live heap small (bounded buckets): fewer
	// collections leave more of a core to the replay (measured: docs/backtest.md).
	debug.SetGCPercent(400)
	rep, err := f.run(ctx, req)
	line.Clear()
	if fe := (*field.Error)(nil); errors.As(err, &fe) {
		return usageError{fmt.Errorf("--%s: %s", fe.Field, fe.Msg)}
	}
	if err != nil {
		return err
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

// backtestFlags are backtest's flags: the history, the rules replayed, what is reported.
type backtestFlags struct {
	c                           clickhouseFlags
	rulesPath, from, to, format string
	subject, tier, rule         string
	top                         int
	warmup                      time.Duration
	live, inChecker             bool
	bounds                      backtest.Config
}

func (f *backtestFlags) register(fs *flagSet) {
	f.c.register(fs, "clickhouse://127.0.0.1:9000/quotaflow")
	fs.StringVar(&f.rulesPath, "rules", "", "the rules `file` to replay the history under (required)")
	fs.StringVar(&f.from, "from", "", "start of the history: an RFC 3339 `time`, or a duration before now (default 1h; with --live-candidates, the whole retained history)")
	fs.StringVar(&f.to, "to", "0s", "end of the history (excluded): an RFC 3339 `time`, or a duration before now")
	fs.StringVar(&f.subject, "subject", "", "report only this `subject`'s checks, as the audit names it (user:alice, ip:10.0.0.1, api_key:k1)")
	fs.StringVar(&f.tier, "tier", "", "report only the checks of this `tier`")
	fs.StringVar(&f.rule, "rule", "", "report only the checks this `rule` (an id of the rules file) applied to")
	fs.IntVar(&f.top, "top", 10, "how many subjects to list (at most 1000)")
	fs.DurationVar(&f.warmup, "warmup", 0, "history replayed before --from, unreported (0: the longest window of the rules, at most 24h; negative: none)")
	fs.StringVar(&f.format, "format", "table", "output `format`: table, json or csv")
	fs.IntVar(&f.bounds.MaxRules, "max-rules", 0, "refuse a rules file of more rules (0: no bound; a checker's admin API allows 100)")
	fs.Int64Var(&f.bounds.MaxRecords, "max-records", 0, "refuse a history (with its warm-up) of more audit rows (0: no bound; a checker's admin API allows 500,000)")
	fs.IntVar(&f.bounds.MaxBuckets, "max-buckets", 0, "most buckets the replay holds at once, the expired going first (0: 4Mi; a checker's admin API 256Ki)")
	fs.BoolVar(&f.inChecker, "checker-bounds", false, "apply the bounds of a checker's admin API (100 rules, 500,000 rows, 256Ki buckets, 32 MiB of plans): what POST /api/v1/rules:backtest would run, and at what memory")
	fs.BoolVar(&f.live, "live-candidates", false, "compare the candidate rules' recorded answers with their live rules' instead of replaying (--rules optional, to check --rule and --tier)")
}

// request checks the flags and returns the backtest they ask for, as of now.
func (f *backtestFlags) request(now time.Time) (backtest.Request, error) {
	var req backtest.Request
	switch {
	case f.format != "table" && f.format != "json" && f.format != "csv":
		return req, fmt.Errorf("--format: %q is not table, json or csv", f.format)
	case f.rulesPath == "" && !f.live:
		return req, errors.New("--rules: required: the rules file to replay the history under")
	case f.live && f.warmup != 0:
		return req, errors.New("--warmup: --live-candidates replays nothing")
	}
	var set *rules.Set
	var err error
	if f.rulesPath != "" {
		if set, err = rules.Load(f.rulesPath); err != nil {
			return req, fmt.Errorf("--rules: %w", err)
		}
	}
	req = backtest.Request{Rules: set, Subject: f.subject, Tier: f.tier, Rule: f.rule, Top: f.top, Warmup: f.warmup}
	from := f.from
	if from == "" && !f.live {
		from = "1h"
	}
	if from != "" {
		if req.From, err = backtest.ParseWhen(from, now); err != nil {
			return req, fmt.Errorf("--from: %w", err)
		}
	}
	if req.To, err = backtest.ParseWhen(f.to, now); err != nil {
		return req, fmt.Errorf("--to: %w", err)
	}
	return req, nil
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
	if f.live {
		return bt.LiveCandidates(ctx, req)
	}
	return bt.Run(ctx, req)
}
