package report

import (
	"cmp"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/audit"
)

// Balance prints a subject's balance of an entitlement: a line of totals, then its grants,
// voided, spent and not-yet-started ones marked, as of now.
func Balance(w io.Writer, b admin.BalanceView, now time.Time) error {
	fmt.Fprintf(w, "%s of %s:%s: %d left, %d used, %d overage, period %s to %s\n", b.Entitlement, b.Dimension, b.Subject,
		b.Remaining, b.Used, b.Overage, b.PeriodStart.Format(time.DateOnly), b.PeriodEnd.Format(time.DateOnly))
	if len(b.Grants) == 0 {
		_, err := fmt.Fprintln(w, "no grants")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GRANT\tLEFT\tAMOUNT\tPRIORITY\tEXPIRES\tRECURS\tSTATE\tREASON")
	for _, g := range b.Grants {
		state := "live"
		switch {
		case !g.VoidedAt.IsZero():
			state = "voided " + g.VoidedAt.Format(time.DateOnly)
		case g.EffectiveAt.After(now):
			state = "from " + g.EffectiveAt.Format(time.DateOnly)
		case !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(now):
			state = "expired"
		case !g.Live:
			state = "spent"
		}
		recurs := "-"
		if g.Recurring {
			recurs = "yes"
			if r := g.Rollover; r != nil {
				recurs += " (rollover " + strconv.FormatInt(r.Min, 10) + "-" + strconv.FormatInt(r.Max, 10) + ")"
			}
		}
		exp := "never"
		if !g.ExpiresAt.IsZero() {
			exp = g.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", g.ID, g.Remaining, g.Amount, g.Priority, exp, recurs, state, cmp.Or(g.Reason, "-"))
	}
	return tw.Flush()
}

// Webhooks prints the webhook endpoints, their secrets masked; "none" without any.
func Webhooks(w io.Writer, eps []admin.EndpointView) error {
	if len(eps) == 0 {
		_, err := fmt.Fprintln(w, "no webhook endpoints")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tEVENTS\tSECRET\tSTATE")
	for _, ep := range eps {
		events, state := "all", "enabled"
		if len(ep.Filter) > 0 {
			events = strings.Join(ep.Filter, ",")
		}
		if ep.Disabled {
			state = "disabled"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ep.ID, ep.URL, events, ep.SecretHint, state)
	}
	return tw.Flush()
}

// Deliveries prints an endpoint's delivery log, the newest first.
func Deliveries(w io.Writer, ds []audit.Delivery) error {
	if len(ds) == 0 {
		_, err := fmt.Fprintln(w, "no deliveries")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tEVENT\tATTEMPT\tSTATUS\tOUTCOME\tTOOK\tERROR")
	for _, d := range ds {
		status := "-"
		if d.Status > 0 {
			status = strconv.Itoa(d.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%dms\t%s\n", d.At.Local().Format(time.DateTime), d.MessageID, d.Attempt, status, d.Outcome,
			d.DurationMs, cmp.Or(d.Error, "-"))
	}
	return tw.Flush()
}
