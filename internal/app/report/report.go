// Package report renders quotaflow's answers for people at a terminal: a check's decision
// with every limit it evaluated, a settlement, a build's version, the rules of a rules
// document (as a table or as YAML) and what applying one changed, the overrides in force.
// Each is aligned text; the commands that print them offer JSON for programs. It also makes
// the calls whose answers it renders (a check, a settlement, a lease's release: Check,
// Settle, Release), so that request and rendering are kept in step. It is apart from the
// commands so that each command keeps to its flags, and one answer reads alike wherever it is
// printed.
package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/spell"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// decision is what a check or a quota query answered.
type Decision struct {
	Allowed      bool
	RuleID       string
	Remaining    int64
	Limit        int64
	ResetAt      int64 // Unix seconds
	RetryAfter   int64 // seconds, rounded up
	RetryAfterMs int64
	State        quotaflowv1.State
	Tier         string
	Degraded     bool
	Replayed     bool
	Limits       []*quotaflowv1.LimitStatus
	// LeaseID and LeaseExpiresAtMs are an allowed check's hold on its concurrency rules'
	// places (empty for none): printed, so that the caller can release it.
	LeaseID          string
	LeaseExpiresAtMs int64
	// ReservationID and ReservationExpiresAtMs are an allowed Reserve's reservation (empty for
	// none): printed, so that the caller can settle it.
	ReservationID          string
	ReservationExpiresAtMs int64
	// DelayUs is an allowed check's wait before going on (a rule with on_limit: delay).
	DelayUs int64
}

// reserveDecision is the decision of a Reserve response: its check's, and its reservation.
func reserveDecision(m *quotaflowv1.ReserveResponse) Decision {
	d := CheckDecision(m.GetResult())
	d.ReservationID, d.ReservationExpiresAtMs = m.ReservationId, m.ExpiresAtMs
	return d
}

// CheckDecision is the decision of a CheckRateLimit response.
func CheckDecision(m *quotaflowv1.CheckRateLimitResponse) Decision {
	return Decision{m.Allowed, m.RuleId, m.Remaining, m.Limit, m.ResetAt, m.RetryAfter, m.RetryAfterMs, m.State, m.Tier, m.Degraded, m.Replayed, m.Limits,
		m.LeaseId, m.LeaseExpiresAtMs, "", 0, m.DelayUs}
}

// QuotaDecision is the decision of a GetRemainingQuota response.
func QuotaDecision(m *quotaflowv1.GetRemainingQuotaResponse) Decision {
	return Decision{m.Allowed, m.RuleId, m.Remaining, m.Limit, m.ResetAt, m.RetryAfter, m.RetryAfterMs, m.State, m.Tier, m.Degraded, false, m.Limits, "", 0, "", 0, 0}
}

// Write prints the verdict on one line, then a table of every limit evaluated.
func (s Decision) Write(w io.Writer) error {
	verdict := "ALLOWED"
	switch {
	case !s.Allowed:
		verdict = fmt.Sprintf("DENIED (retry after %s)", spell.Duration(time.Duration(s.RetryAfterMs)*time.Millisecond))
	case s.DelayUs > 0:
		verdict = fmt.Sprintf("DELAYED (go on after %.3fs)", float64(s.DelayUs)/1e6)
	}
	fmt.Fprintf(w, "%s  tier=%s  state=%s", verdict, s.Tier, enumName(s.State.String(), "STATE_"))
	if s.RuleID != "" {
		fmt.Fprintf(w, "  rule=%s  remaining=%d/%d  reset=%s", s.RuleID, s.Remaining, s.Limit,
			time.Unix(s.ResetAt, 0).UTC().Format(time.RFC3339))
	}
	if s.Degraded {
		fmt.Fprint(w, "  DEGRADED")
	}
	if s.Replayed {
		fmt.Fprint(w, "  REPLAYED")
	}
	fmt.Fprintln(w)
	if s.LeaseID != "" {
		fmt.Fprintf(w, "lease %s until %s (ReleaseLease frees its places)\n", s.LeaseID,
			time.UnixMilli(s.LeaseExpiresAtMs).UTC().Format(time.RFC3339))
	}
	if s.ReservationID != "" {
		fmt.Fprintf(w, "reservation %s until %s (quotaflow settle --id … --actual N)\n", s.ReservationID,
			time.UnixMilli(s.ReservationExpiresAtMs).UTC().Format(time.RFC3339))
	}
	if len(s.Limits) == 0 {
		_, err := fmt.Fprintln(w, "no rule matched")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBJECT\tRULE\tALGORITHM\tLIMIT\tUSED\tREMAINING\tRETRY\tSTATE")
	for _, l := range s.Limits {
		subject := enumName(l.Dimension.String(), "DIMENSION_")
		if l.Dimension != quotaflowv1.Dimension_DIMENSION_GLOBAL {
			subject += ":" + l.Identifier
		}
		rule := l.RuleId
		switch {
		case l.CandidateOf != "":
			rule += " (candidate of " + l.CandidateOf + ")"
		case l.Shadow:
			rule += " (shadow)"
		}
		limit := fmt.Sprintf("%d/%s", l.Limit, spell.Duration(time.Duration(l.WindowMs)*time.Millisecond))
		if l.Burst != l.Limit {
			limit += fmt.Sprintf(" burst %d", l.Burst)
		}
		state := enumName(l.State.String(), "STATE_")
		if l.Degraded {
			state += " (degraded: fail " + l.FailMode + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", subject, rule, l.Algorithm, limit, l.CurrentCount, l.Remaining,
			spell.Duration(time.Duration(l.RetryAfterMs)*time.Millisecond), state)
	}
	return tw.Flush()
}

// ProtoJSON is a response as --json prints it: indented, every field present, zero or not.
func ProtoJSON(msg proto.Message) (string, error) {
	b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(msg)
	if err != nil {
		return "", fmt.Errorf("encode response: %w", err)
	}
	return string(b), nil
}

// enumName is a proto enum value's name as people say it: STATE_WARNING is "warning".
func enumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Exemptions prints a table of exemptions.
func Exemptions(w io.Writer, ex []rules.DocExemption) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSUBJECT\tRULES\tREASON")
	for _, e := range ex {
		rs := "all"
		if len(e.Rules) > 0 {
			rs = strings.Join(e.Rules, ",")
		}
		fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\n", e.ID, e.Dimension, e.Value, rs, e.Reason)
	}
	return tw.Flush()
}

// Override is one override on one line: its id, target, change and expiry.
func Override(o *rules.Override) string {
	return fmt.Sprintf("override %s: %s %s until %s", o.ID, events.OverrideTarget(o), events.OverrideChange(o), o.ExpiresAt.Local().Format(time.RFC3339))
}

// Overrides prints a table of overrides, with the time each has left as of now.
func Overrides(w io.Writer, overrides []rules.Override, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTARGET\tCHANGE\tEXPIRES\tLEFT\tSOURCE\tCREATOR\tREASON")
	for _, o := range overrides {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.ID, events.OverrideTarget(&o), events.OverrideChange(&o),
			o.ExpiresAt.Local().Format(time.RFC3339), o.ExpiresAt.Sub(now).Round(time.Second), o.Source, o.Creator, o.Reason)
	}
	return tw.Flush()
}
