package backtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/schema"
)

// candidateFrom is where the recorded answers of candidate rules (rules.Rule.CandidateOf) are:
// each candidate limit of a decision row (limits.candidate_of set) beside its live rule's limit
// for the same subject in the same row (at), whose answer is live. Fail modes' answers (the
// candidate's limit degraded) compare nothing and are counted apart; idempotent replays,
// settles and lease events decide nothing. The first %s is the database, the second the time
// bounds, the third the request's filters.
const candidateFrom = `FROM %s.decisions ARRAY JOIN limits AS l
WHERE %s AND l.candidate_of != '' AND kind IN ('', 'reserve') AND replayed = 0
  AND (arrayFirstIndex((r, d, i, c) -> r = l.candidate_of AND d = l.dimension AND i = l.identifier AND c = '',
        limits.rule_id, limits.dimension, limits.identifier, limits.candidate_of) AS at) > 0
  AND (limits.allowed[at] AS live) IN (0, 1)%s`

// Compared checks: counted only when no fail mode decided the candidate.
const (
	candChecks    = "countIf(l.degraded = 0)"
	candAgreed    = "countIf(l.degraded = 0 AND live = l.allowed)"
	candDenied    = "countIf(l.degraded = 0 AND live = 1 AND l.allowed = 0)"
	candAllowed   = "countIf(l.degraded = 0 AND live = 0 AND l.allowed = 1)"
	candLiveDeny  = "countIf(l.degraded = 0 AND live = 0)"
	candWouldDeny = "countIf(l.degraded = 0 AND l.allowed = 0)"
)

// LiveCandidates reports what the candidate rules answered on live traffic beside their live
// rules, from the audit: no replay, the answers Redis gave both in the same script run. The
// report reads as a backtest's with the live rule's answer as "then" and the candidate's as
// "now": a rule row per candidate (CandidateOf naming its live rule) and tier, newly denied the
// checks the live rule allowed and the candidate would have denied; a check with two
// candidates counts once for each. Subjects are the limits' subjects. req.Rules is not needed
// (the rows name their rules); when given, Rule and Tier are checked against it. A zero From
// is the start of the audit's retained history.
//
// Its errors are a *field.Error for a request that cannot be run, the context's, or reading
// the audit's.
func (b *Backtester) LiveCandidates(ctx context.Context, req Request) (*Report, error) {
	now := time.Now()
	if req.From.IsZero() {
		req.From = now.AddDate(0, 0, -schema.Retention(schema.Decisions).Days).Add(time.Minute)
	}
	if err := validateWindow(&req, now); err != nil {
		return nil, err
	}
	if req.Rules != nil {
		if err := validateFilters(&req); err != nil {
			return nil, err
		}
	} else if err := validateSubject(req.Subject); err != nil {
		return nil, err
	}
	if !validDatabase(b.cfg.Database) {
		return nil, fmt.Errorf("backtest: database %q is no plain name", b.cfg.Database)
	}
	if req.To.After(now) {
		req.To = now
	}
	if req.Top == 0 {
		req.Top = 10
	}
	began := time.Now()
	var filter strings.Builder
	var args []any
	if req.Rule != "" {
		filter.WriteString(" AND (l.rule_id = ? OR l.candidate_of = ?)")
		args = append(args, req.Rule, req.Rule)
	}
	if req.Tier != "" {
		filter.WriteString(" AND tier = ?")
		args = append(args, req.Tier)
	}
	if req.Subject != "" {
		filter.WriteString(" AND has(subjects, ?)")
		args = append(args, req.Subject)
	}
	from := fmt.Sprintf(candidateFrom, b.cfg.Database, within(req.From, req.To), filter.String())
	rep := &Report{From: req.From, To: req.To, LiveCandidates: true, Reasons: map[string]int64{}, Rules: []RuleRow{}, Subjects: []SubjectRow{}, Hours: []HourRow{}}
	if err := b.candidateRules(ctx, from, args, rep); err != nil {
		return nil, err
	}
	if err := b.candidateSubjects(ctx, from, args, req.Top, rep); err != nil {
		return nil, err
	}
	if err := b.candidateHours(ctx, from, args, rep); err != nil {
		return nil, err
	}
	if rep.Checks > 0 {
		rep.Agreement = float64(rep.Agreed) / float64(rep.Checks)
	}
	rep.Elapsed = time.Since(began)
	b.log.Info("live candidates compared", "from", req.From, "to", req.To, "checks", rep.Checks, "agreement", rep.Agreement, "elapsed", rep.Elapsed)
	return rep, nil
}

// candidateRules fills the report's totals and its rows per candidate and tier.
func (b *Backtester) candidateRules(ctx context.Context, from string, args []any, rep *Report) error {
	q := fmt.Sprintf(`SELECT l.rule_id, l.candidate_of, tier, count(), %s, %s, %s, %s, %s, %s
%s
GROUP BY l.rule_id, l.candidate_of, tier
ORDER BY l.rule_id, tier`, candChecks, candAgreed, candLiveDeny, candWouldDeny, candDenied, candAllowed, from)
	return scanRows(ctx, b.cfg.Conn, q, args, func(rows driver.Rows) error {
		var rr RuleRow
		var records, checks, agreed, liveDenied, wouldDeny, denied, allowed uint64
		if err := rows.Scan(&rr.Rule, &rr.CandidateOf, &rr.Tier, &records, &checks, &agreed, &liveDenied, &wouldDeny, &denied, &allowed); err != nil {
			return err
		}
		rr.Checks, rr.DeniedThen, rr.WouldDeny = int64(checks), int64(liveDenied), int64(wouldDeny)
		rr.NewlyDenied, rr.NewlyAllowed = int64(denied), int64(allowed)
		rep.Rules = append(rep.Rules, rr)
		rep.Records += int64(records)
		rep.Skipped.FailMode += int64(records - checks)
		rep.Checks, rep.Agreed = rep.Checks+int64(checks), rep.Agreed+int64(agreed)
		rep.NewlyDenied, rep.NewlyAllowed = rep.NewlyDenied+int64(denied), rep.NewlyAllowed+int64(allowed)
		return nil
	})
}

// candidateSubjects fills the subjects with the most changed answers, top of them.
func (b *Backtester) candidateSubjects(ctx context.Context, from string, args []any, top int, rep *Report) error {
	q := fmt.Sprintf(`SELECT if(l.dimension = 'global', 'global', concat(l.dimension, ':', l.identifier)) AS subject, %s AS denied, %s AS allowed
%s
GROUP BY subject
HAVING denied + allowed > 0
ORDER BY denied + allowed DESC, subject
LIMIT %d`, candDenied, candAllowed, from, top)
	return scanRows(ctx, b.cfg.Conn, q, args, func(rows driver.Rows) error {
		var sr SubjectRow
		var denied, allowed uint64
		if err := rows.Scan(&sr.Subject, &denied, &allowed); err != nil {
			return err
		}
		sr.NewlyDenied, sr.NewlyAllowed = int64(denied), int64(allowed)
		rep.Subjects = append(rep.Subjects, sr)
		return nil
	})
}

// candidateHours fills the report's hours: those with compared checks.
func (b *Backtester) candidateHours(ctx context.Context, from string, args []any, rep *Report) error {
	q := fmt.Sprintf(`SELECT intDiv(time_us, 3600000000) AS hour, %s AS checks, %s, %s
%s
GROUP BY hour
HAVING checks > 0
ORDER BY hour`, candChecks, candDenied, candAllowed, from)
	return scanRows(ctx, b.cfg.Conn, q, args, func(rows driver.Rows) error {
		var hour int64
		var checks, denied, allowed uint64
		if err := rows.Scan(&hour, &checks, &denied, &allowed); err != nil {
			return err
		}
		rep.Hours = append(rep.Hours, HourRow{Hour: time.Unix(hour*3600, 0).UTC(), Checks: int64(checks), NewlyDenied: int64(denied), NewlyAllowed: int64(allowed)})
		return nil
	})
}

// scanRows runs q with args and calls scan on each row.
func scanRows(ctx context.Context, conn driver.Conn, q string, args []any, scan func(driver.Rows) error) error {
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read the audit's candidates: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("read the audit's candidates: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the audit's candidates: %w", err)
	}
	return nil
}
