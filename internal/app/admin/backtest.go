package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/backtest"
	"github.com/quotaflow/quotaflow/internal/field"
)

// Backtester replays the decision audit through a rule set (backtest.Backtester). Its errors
// are a *field.Error for a request it cannot run (answered 400), the context's, or
// reading the audit's (503).
type Backtester interface {
	Run(ctx context.Context, req backtest.Request) (*backtest.Report, error)
	// LiveCandidates reports the candidate rules' recorded answers beside their live rules'.
	LiveCandidates(ctx context.Context, req backtest.Request) (*backtest.Report, error)
}

var _ Backtester = (*backtest.Backtester)(nil)

// backtestRequest is the body of POST /api/v1/rules:backtest. Rules is a rules document as
// PUT /api/v1/rules takes it; omitted, the rules in force are replayed (their agreement with
// the recorded answers). From and To are RFC 3339 times; To omitted means now.
type backtestRequest struct {
	Rules   *rules.Document `json:"rules"`
	From    time.Time       `json:"from"`
	To      time.Time       `json:"to"`
	Subject string          `json:"subject"`
	Tier    string          `json:"tier"`
	Rule    string          `json:"rule"`
	Top     int             `json:"top"`
	// Warmup is a Go duration ("1h"); empty means the rules' longest window, at most a day.
	Warmup string `json:"warmup"`
	// LiveCandidates compares the candidate rules' recorded answers with their live rules'
	// instead of replaying (backtest.Backtester.LiveCandidates): rules and warmup are then
	// not taken, and an omitted from is the start of the retained history.
	LiveCandidates bool `json:"live_candidates"`
}

// backtest answers POST /api/v1/rules:backtest with the report as JSON, or as CSV with
// ?format=csv. It needs a read token: it changes nothing. One runs at a time per checker.
func (a *API) backtest(r *http.Request, _ caller) (int, any, error) {
	if a.backtester == nil {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "backtests read the ClickHouse audit: start the checker with --audit-clickhouse-dsn"}
	}
	// A replay takes a core for minutes on a checker that also answers checks: one at a time.
	if !a.backtesting.CompareAndSwap(false, true) {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "a backtest is running on this checker: retry when it is done, or run quotaflow backtest elsewhere"}
	}
	defer a.backtesting.Store(false)
	format := r.URL.Query().Get("format")
	if format != "" && format != "json" && format != "csv" {
		return 0, nil, badField("format", "%q is not json or csv", format)
	}
	var body backtestRequest
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	req := backtest.Request{From: body.From, To: body.To, Subject: body.Subject, Tier: body.Tier, Rule: body.Rule, Top: body.Top}
	if body.Warmup != "" {
		d, err := time.ParseDuration(body.Warmup)
		if err != nil {
			return 0, nil, badField("warmup", "%q is no duration (1h, 30m)", body.Warmup)
		}
		req.Warmup = d
	}
	var err error
	if body.LiveCandidates {
		if body.Rules != nil || body.Warmup != "" {
			return 0, nil, badField("live_candidates", "compares what was recorded: it takes no rules and no warmup")
		}
		rep, err := a.backtester.LiveCandidates(r.Context(), req)
		return backtestAnswer(rep, err, format)
	}
	if body.Rules != nil {
		if req.Rules, err = body.Rules.Compile(); err != nil {
			return 0, nil, err
		}
	} else if req.Rules, err = a.store.Current(r.Context()); err != nil {
		return 0, nil, err
	}
	rep, err := a.backtester.Run(r.Context(), req)
	return backtestAnswer(rep, err, format)
}

// backtestAnswer answers a backtest's report, or its error, in format.
func backtestAnswer(rep *backtest.Report, err error, format string) (int, any, error) {
	if fe := (*field.Error)(nil); errors.As(err, &fe) {
		return 0, nil, badField(fe.Field, "%s", fe.Msg)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("backtest: %w", err)
	}
	if format == "csv" {
		return http.StatusOK, csvBody{rep}, nil
	}
	return http.StatusOK, rep, nil
}

// csvBody is a report the API writes as CSV.
type csvBody struct {
	rep interface{ WriteCSV(io.Writer) error }
}

// writeCSV writes b as text/csv.
func (b csvBody) writeCSV(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.WriteHeader(status)
	_ = b.rep.WriteCSV(w) // the status is sent: a failed write is the client gone
}
