package dashboard

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

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
)

// Status is what quotaflow status shows: every process's view, the overrides, the fail modes.
type Status struct {
	At        time.Time        `json:"at"`
	Processes []health.Report  `json:"processes"`
	Overrides []rules.Override `json:"overrides"`
	// FailMode lists what is answered by fail mode now, one line per checker and rule.
	FailMode []string `json:"fail_mode"`
	// Problems are why the status is unhealthy; empty when healthy.
	Problems []string `json:"problems"`
}

// StatusConfig says where the status is read. The zero value reads nats.DefaultURL without
// credentials.
type StatusConfig struct {
	NATSURL string // "" means nats.DefaultURL
	// Credentials authenticates the connection (a credentials file, "" none): the operator
	// role's, which may read the health reports and the rule store.
	Credentials string
}

// ReadStatus reads the health reports and the overrides and judges them; ctx bounds the
// reads, the connection taking at most 5s.
func ReadStatus(ctx context.Context, cfg StatusConfig) (*Status, error) {
	nc, js, err := connect(cfg.NATSURL, "quotaflow status", cfg.Credentials, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	return readStatus(ctx, js)
}

// readStatus reads the health reports and the overrides from js and judges them.
func readStatus(ctx context.Context, js jetstream.JetStream) (*Status, error) {
	st := &Status{At: time.Now(), Problems: []string{}, FailMode: []string{}}
	var err error
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
func (st *Status) judge() {
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

// Write prints the status as one screen of text, in one write.
func (st *Status) Write(w io.Writer) error {
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
	writeVersions(b, st.Processes)
	if len(st.Problems) > 0 {
		fmt.Fprintf(b, "\nDOWN\n")
		for _, p := range st.Problems {
			fmt.Fprintf(b, "  %s\n", p)
		}
	}
	st.writeOverrides(b)
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

// writeVersions names the build the processes run: one line when they all run one, else a
// line per build with its processes, as in a rolling upgrade.
func writeVersions(b *strings.Builder, procs []health.Report) {
	var builds []string
	by := map[string][]string{}
	for _, r := range procs {
		if by[r.Version] == nil {
			builds = append(builds, r.Version)
		}
		by[r.Version] = append(by[r.Version], r.Role+" "+r.Instance)
	}
	if len(builds) == 1 {
		fmt.Fprintf(b, "VERSION  %s\n", builds[0])
		return
	}
	for _, v := range builds {
		fmt.Fprintf(b, "VERSION  %s: %s\n", v, strings.Join(by[v], ", "))
	}
}

// WriteJSON prints the status as one indented JSON object, for programs.
func (st *Status) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(st)
}

// writeOverrides prints the overrides section, each with the time it has left.
func (st *Status) writeOverrides(b *strings.Builder) {
	fmt.Fprintf(b, "\nOVERRIDES (%d active)\n", len(st.Overrides))
	if len(st.Overrides) == 0 {
		fmt.Fprintln(b, "  none")
		return
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tTARGET\tCHANGE\tEXPIRES\tBY\tREASON")
	for _, o := range st.Overrides {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", o.ID, events.OverrideTarget(&o), events.OverrideChange(&o),
			o.ExpiresAt.Sub(st.At).Round(time.Second), overrideMaker(o), o.Reason)
	}
	tw.Flush()
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

// overrideMaker is who made the override: a policy's are marked, since no person did.
func overrideMaker(o rules.Override) string {
	if o.Source != "" && o.Source != "admin" {
		return "policy " + o.Source
	}
	return o.Creator
}
