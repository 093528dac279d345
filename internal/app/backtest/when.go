package backtest

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

// Spec is a backtest as a person asks for it (quotaflow backtest's flags): the rules as a file,
// the bounds as times or durations before now.
type Spec struct {
	// RulesFile is the rules file replayed; required unless Live.
	RulesFile string
	// From and To are ParseWhen's: From defaults to 1h, or with Live to the whole retained
	// history; To to now.
	From, To string
	// Live compares the candidate rules' recorded answers (LiveCandidates) instead of
	// replaying, and so takes no Warmup.
	Live bool
	// Warmup, Subject, Tier, Rule and Top are Request's.
	Warmup              time.Duration
	Subject, Tier, Rule string
	Top                 int
}

// Request is the Request s asks for as of now. Its errors are *field.Errors naming rules,
// from, to or warmup.
func (s Spec) Request(now time.Time) (Request, error) {
	req := Request{Subject: s.Subject, Tier: s.Tier, Rule: s.Rule, Top: s.Top, Warmup: s.Warmup}
	switch {
	case s.RulesFile == "" && !s.Live:
		return req, field.Errorf("rules", "required: the rules file to replay the history under")
	case s.Live && s.Warmup != 0:
		return req, field.Errorf("warmup", "a comparison of live candidates replays nothing")
	}
	var err error
	if s.RulesFile != "" {
		if req.Rules, err = rules.Load(s.RulesFile); err != nil {
			return req, field.Wrap("rules", err)
		}
	}
	if s.From == "" && !s.Live {
		s.From = "1h"
	}
	if s.From != "" {
		if req.From, err = ParseWhen(s.From, now); err != nil {
			return req, field.Wrap("from", err)
		}
	}
	if req.To, err = ParseWhen(cmp.Or(s.To, "0s"), now); err != nil {
		return req, field.Wrap("to", err)
	}
	return req, nil
}

// ParseWhen reads a bound of a backtest's history (Request.From, To): an RFC 3339 time, or a
// duration before now (24h), as quotaflow backtest's --from and --to take them.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("%q: a duration before now cannot be negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-11-27T10:00:00Z) nor a duration before now (24h)", s)
	}
	return t, nil
}

// String is p on one line: how far the replay is (the warm-up, or the share of [From, To)),
// the audit rows read and the time taken.
func (p Progress) String() string {
	at := "warm-up"
	if !p.At.Before(p.From) {
		at = fmt.Sprintf("%3.0f%%", 100*p.Fraction())
	}
	return fmt.Sprintf("%s, %s audit rows, %s", at, strings.TrimSpace(fmt.Sprintf("%9d", p.Records)), p.Elapsed.Round(time.Second))
}
