package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
)

// unhealthyError is a status that found a dependency down or no process reporting (exit
// status 4): a script or a probe tells it from a status that could not be asked (1).
type unhealthyError struct{ problems []string }

func (e unhealthyError) Error() string { return "unhealthy: " + strings.Join(e.problems, "; ") }

// status is what quotaflow status shows: every process's view, the overrides, the fail modes.
type status struct {
	At        time.Time        `json:"at"`
	Processes []health.Report  `json:"processes"`
	Overrides []rules.Override `json:"overrides"`
	// FailMode lists what is answered by fail mode now, one line per checker and rule.
	FailMode []string `json:"fail_mode"`
	// Problems are why the exit status is 4; empty when healthy.
	Problems []string `json:"problems"`
}

func runStatus(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", `Shows on one screen how quotaflow is doing, as each of its processes sees it: every checker's
and aggregator's view of Redis, NATS and ClickHouse (from the health reports they put in NATS
every 2s, bucket QUOTAFLOW_HEALTH), the checks per second each checker decides, the
aggregators' lag, partitions and leader, the active overrides (those a policy made marked
"policy"), and what is answered by fail mode right now.

Exit status: 0 every process sees every dependency up; 4 a dependency is down somewhere, or no
process reports; 1 NATS could not be asked; 2 bad flags.`, stderr)
	var natsURL, creds, format string
	var timeout time.Duration
	fs.StringVar(&natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL` the processes report to")
	fs.StringVar(&format, "format", "text", "`format`: text (one screen) or json")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for NATS")
	fs.fromEnv("nats-url")
	registerReaderCreds(fs, &creds)
	fs.check(func() error {
		switch {
		case format != "text" && format != "json":
			return fmt.Errorf("--format: want text or json, got %q", format)
		case timeout <= 0:
			return fmt.Errorf("--timeout: want more than 0, got %s", timeout)
		case !strings.HasPrefix(natsURL, "nats://") && !strings.HasPrefix(natsURL, "tls://"):
			return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", natsURL)
		}
		return nil
	})
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := readStatus(ctx, natsURL, creds)
	if err != nil {
		return err
	}
	if format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return err
		}
	} else if err := st.write(stdout); err != nil {
		return err
	}
	if len(st.Problems) > 0 {
		return unhealthyError{st.Problems}
	}
	return nil
}

// readStatus reads the reports and the overrides and judges them.
func readStatus(ctx context.Context, natsURL, creds string) (*status, error) {
	nc, err := readerConn(natsURL, "quotaflow status", creds, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	st := &status{At: time.Now(), Problems: []string{}, FailMode: []string{}}
	if st.Processes, err = health.List(ctx, js); err != nil {
		return nil, err
	}
	if st.Overrides, err = rulestore.ReadOverrides(ctx, js); err != nil {
		return nil, err
	}
	if st.Processes == nil {
		st.Processes = []health.Report{}
	}
	if st.Overrides == nil {
		st.Overrides = []rules.Override{}
	}
	st.judge()
	return st, nil
}

// judge lists the problems and what fail modes answer.
func (st *status) judge() {
	if len(st.Processes) == 0 {
		st.Problems = append(st.Problems, "no checker or aggregator reports its health")
	}
	for _, r := range st.Processes {
		for _, dep := range r.Down() {
			st.Problems = append(st.Problems, fmt.Sprintf("%s %s sees %s down: %s", r.Role, r.Instance, dep, r.Dependencies[dep].Error))
		}
		if r.Checker == nil {
			continue
		}
		for _, f := range r.Checker.FailMode {
			st.FailMode = append(st.FailMode, fmt.Sprintf("checker %s rule %s (%s): %s", r.Instance, f.Rule, f.FailMode, f.Reason))
		}
		if len(r.Checker.FailMode) == 0 && r.Checker.Rates.Degraded > 0 {
			st.FailMode = append(st.FailMode, fmt.Sprintf("checker %s: %.1f checks/s (Redis slow or the checker overloaded)",
				r.Instance, r.Checker.Rates.Degraded))
		}
	}
}

// write prints the status as one screen of text.
func (st *status) write(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "quotaflow status at %s\n\nPROCESSES (%d reporting)\n", st.At.Format(time.DateTime), len(st.Processes))
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tINSTANCE\tHOST\tUP\tREDIS\tNATS\tCLICKHOUSE\tCHECKS/S\tLAG")
	for _, r := range st.Processes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Role, r.Instance, r.Host,
			r.At.Sub(r.Started).Round(time.Second), depState(r, health.Redis), depState(r, health.NATS),
			depState(r, health.ClickHouse), checksCell(r), lagCell(r))
	}
	tw.Flush()
	if len(st.Problems) > 0 {
		fmt.Fprintf(b, "\nDOWN\n")
		for _, p := range st.Problems {
			fmt.Fprintf(b, "  %s\n", p)
		}
	}
	fmt.Fprintf(b, "\nOVERRIDES (%d active)\n", len(st.Overrides))
	if len(st.Overrides) == 0 {
		fmt.Fprintln(b, "  none")
	} else {
		tw = tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tTARGET\tCHANGE\tEXPIRES\tBY\tREASON")
		for _, o := range st.Overrides {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", o.ID, overrideTarget(o), overrideChange(o),
				o.ExpiresAt.Sub(st.At).Round(time.Second), overrideMaker(o), o.Reason)
		}
		tw.Flush()
	}
	fmt.Fprintf(b, "\nANSWERING BY FAIL MODE NOW\n")
	if len(st.FailMode) == 0 {
		fmt.Fprintln(b, "  none")
	}
	for _, f := range st.FailMode {
		fmt.Fprintf(b, "  %s\n", f)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// depState is a report's state of dep ("-" when the process does not use it), with how long
// it has been down.
func depState(r health.Report, dep string) string {
	d, ok := r.Dependencies[dep]
	switch {
	case !ok:
		return "-"
	case d.State == health.StateDown && !d.Since.IsZero():
		return fmt.Sprintf("DOWN %s", r.At.Sub(d.Since).Round(time.Second))
	case d.State == health.StateDown:
		return "DOWN"
	}
	return string(d.State)
}

func checksCell(r health.Report) string {
	if r.Checker == nil {
		return "-"
	}
	c := r.Checker.Rates
	s := fmt.Sprintf("%.1f", c.Total())
	if c.Total() > 0 {
		s += fmt.Sprintf(" (%.0f denied", c.Denied)
		if c.Degraded > 0 {
			s += fmt.Sprintf(", %.0f degraded", c.Degraded)
		}
		s += ")"
	}
	return s
}

func lagCell(r health.Report) string {
	a := r.Aggregator
	if a == nil {
		return "-"
	}
	s := fmt.Sprintf("%d msgs, %d partitions", a.Lag, a.Partitions)
	if a.Leader {
		s += ", leader"
	}
	return s
}

func overrideTarget(o rules.Override) string {
	var t string
	switch o.Target() {
	case "subject":
		t = o.Dimension + ":" + o.Identifier
	case "tier":
		t = "tier " + o.Tier
	default:
		return "rule " + o.RuleID
	}
	if o.RuleID != "" {
		t += " rule " + o.RuleID
	}
	return t
}

func overrideChange(o rules.Override) string {
	if o.Limit != 0 {
		return fmt.Sprintf("limit %d", o.Limit)
	}
	return fmt.Sprintf("×%g", o.Multiplier)
}

// overrideMaker is who made the override: a policy's are marked, since no person did.
func overrideMaker(o rules.Override) string {
	if o.Source != "" && o.Source != "admin" {
		return "policy " + o.Source
	}
	return o.Creator
}

// registerHealthInterval adds --health-interval, the time between a daemon's health reports.
func registerHealthInterval(fs *flagSet, cfg *health.Config) {
	fs.DurationVar(&cfg.Interval, "health-interval", health.DefaultInterval, "time between this process's health reports into NATS (quotaflow status); negative: no reports")
	fs.fromEnv("health-interval")
	fs.check(func() error {
		if cfg.Interval >= 0 && cfg.Interval < 100*time.Millisecond {
			return fmt.Errorf("--health-interval: want at least 100ms, or negative for no reports, got %s", cfg.Interval)
		}
		return nil
	})
}
