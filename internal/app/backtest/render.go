package backtest

import (
	"encoding/csv"
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"
)

// WriteTable writes the report for a terminal: the summary, then the rules, subjects and hours
// with changed answers.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	read := "audit rows"
	if r.LiveCandidates {
		read = "candidate answers"
	}
	fmt.Fprintf(tw, "history\t%s to %s (%d %s read in %s)\n", r.From.UTC().Format(time.RFC3339), r.To.UTC().Format(time.RFC3339),
		r.Records, read, r.Elapsed.Round(time.Millisecond))
	then, now := "DENIED THEN", "WOULD DENY"
	if r.LiveCandidates {
		then, now = "LIVE DENIED", "CANDIDATE DENIED"
		fmt.Fprintf(tw, "candidate answers compared\t%d (each with its live rule's, in the same check)\n", r.Checks)
	} else {
		fmt.Fprintf(tw, "checks replayed\t%d\n", r.Checks)
	}
	fmt.Fprintf(tw, "same answer\t%d (%.4f%%)\n", r.Agreed, 100*r.Agreement)
	fmt.Fprintf(tw, "newly denied\t%d\n", r.NewlyDenied)
	fmt.Fprintf(tw, "newly allowed\t%d\n", r.NewlyAllowed)
	if r.Refused > 0 {
		fmt.Fprintf(tw, "refused as invalid\t%d\n", r.Refused)
	}
	if r.LiveCandidates {
		fmt.Fprintf(tw, "answered by a fail mode\t%d (not compared)\n", r.Skipped.FailMode)
	} else {
		fmt.Fprintf(tw, "not replayed\t%d idempotent replays, %d settles and cancels, %d lease events\n",
			r.Skipped.Replays, r.Skipped.Settles, r.Skipped.Leases)
	}
	if r.Skipped.Unreadable > 0 {
		fmt.Fprintf(tw, "unreadable rows\t%d\n", r.Skipped.Unreadable)
	}
	for _, k := range sortedReasons(r.Reasons) {
		fmt.Fprintf(tw, "changed: %s\t%d\n", k, r.Reasons[k])
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "RULE\tTIER\tCHECKS\t%s\t%s\tNEWLY DENIED\tNEWLY ALLOWED\n", then, now)
	for _, rr := range r.Rules {
		rule := rr.Rule
		if rr.CandidateOf != "" {
			rule += " (candidate of " + rr.CandidateOf + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", rule, rr.Tier, rr.Checks, rr.DeniedThen, rr.WouldDeny, rr.NewlyDenied, rr.NewlyAllowed)
	}
	if len(r.Subjects) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SUBJECT\tNEWLY DENIED\tNEWLY ALLOWED")
		for _, s := range r.Subjects {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", s.Subject, s.NewlyDenied, s.NewlyAllowed)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "HOUR (UTC)\tCHECKS\tNEWLY DENIED\tNEWLY ALLOWED")
	for _, h := range r.Hours {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", h.Hour.UTC().Format("2006-01-02 15:04"), h.Checks, h.NewlyDenied, h.NewlyAllowed)
	}
	return tw.Flush()
}

// WriteCSV writes the report as one CSV table: its first column says which part a row is of
// (summary, reason, rule, subject, hour), and the columns after it are that part's. In a
// report of live candidates, denied_then is the live rule's denials and would_deny the
// candidate's, and a rule row's candidate_of names the live rule.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	rows := [][]string{
		{"part", "name", "tier", "checks", "denied_then", "would_deny", "newly_denied", "newly_allowed", "candidate_of"},
		{"summary", "all", "", i(r.Checks), "", "", i(r.NewlyDenied), i(r.NewlyAllowed), ""},
	}
	for _, k := range sortedReasons(r.Reasons) {
		rows = append(rows, []string{"reason", k, "", i(r.Reasons[k]), "", "", "", "", ""})
	}
	for _, rr := range r.Rules {
		rows = append(rows, []string{"rule", rr.Rule, rr.Tier, i(rr.Checks), i(rr.DeniedThen), i(rr.WouldDeny), i(rr.NewlyDenied), i(rr.NewlyAllowed), rr.CandidateOf})
	}
	for _, s := range r.Subjects {
		rows = append(rows, []string{"subject", s.Subject, "", "", "", "", i(s.NewlyDenied), i(s.NewlyAllowed), ""})
	}
	for _, h := range r.Hours {
		rows = append(rows, []string{"hour", h.Hour.UTC().Format(time.RFC3339), "", i(h.Checks), "", "", i(h.NewlyDenied), i(h.NewlyAllowed), ""})
	}
	if err := cw.WriteAll(rows); err != nil {
		return fmt.Errorf("backtest: write csv: %w", err)
	}
	return nil
}

func sortedReasons(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
