package rules

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// An entitlement is a metered feature sold as a balance rather than a rate: "1M tokens a month
// on the Pro plan, plus the 2M top-up bought yesterday". The rules document declares it (whose
// subjects hold balances, how time is cut into periods, what happens at zero, which crossings
// are worth telling someone about); its balances are made of grants (grant.go), created through
// the admin API, and burned by the checks that name the entitlement or call one of its
// endpoints, in the same script call as the check's other limits.

// MaxAmount bounds every amount of an entitlement (a grant, a cost, a cap, a threshold): 2^44,
// about 17.6 trillion, so that a subject's balance, the sum of at most MaxGrants grants, stays
// exact in the doubles Redis's Lua counts in (2^53).
const MaxAmount = 1 << 44

// MaxGrants bounds the grants one subject holds of one entitlement: a burn reads them all.
const MaxGrants = 256

// MaxThresholds bounds each kind of threshold of an entitlement: each crossing is an event and
// a webhook, and a balance crossed by a hundred lines at once informs nobody.
const MaxThresholds = 10

// NoCap is an OverageCap without bound.
const NoCap = -1

// Entitlement is one validated entitlement.
type Entitlement struct {
	ID string
	// Dimension is the kind of subject that holds the balances: DimensionUser, DimensionAPIKey,
	// DimensionOrg, or DimensionDescriptor for a custom dimension named Key (tenant).
	Dimension Dimension
	Key       string
	// Endpoints are patterns (as a rule's endpoint) whose checks burn the entitlement without
	// naming it; empty: only checks that name it.
	Endpoints []string
	// Period cuts time into the periods recurring grants are issued for and usage is counted
	// in: days, weeks, months or years from midnight in its Location.
	Period calendar.Period
	// Soft allows a check past a zero balance and counts the excess as overage, up to
	// OverageCap per period (NoCap: without bound); hard (false) denies it.
	Soft       bool
	OverageCap int64
	Thresholds EntitlementThresholds
	// FailMode decides a check's charge of the entitlement while Redis cannot be reached:
	// FailOpen (the default, as a rule's) or FailClosed. A balance lives only in Redis, so no
	// process can decide it locally.
	FailMode FailMode

	rule *Rule // the entitlement as a limit of a check (Rule)
}

// Rule is the entitlement as a check applies it, beside the check's rules: a limit of
// algorithm.Balance over the entitlement's holder, that reports under the entitlement's id (no
// rule shares it) and never warns by the rules' thresholds (its own are the entitlement's).
// Do not modify it.
func (e *Entitlement) Rule() *Rule { return e.rule }

// Warning are the warning thresholds of e's balances, as a check's answer and the aggregator's
// warning events apply them to a balance reported as a limit (used of what the period had,
// used and left): warning from e's lowest used_percent, never without one. Its own thresholds'
// crossings are told apart, each once (entitlement events).
func (e *Entitlement) Warning() Thresholds {
	t := Thresholds{Enter: 1, Exit: 1, QuietPeriod: DefaultThresholds.QuietPeriod}
	if pct := e.Thresholds.UsedPercent; len(pct) > 0 {
		t.Enter = float64(pct[0]) / 100
		t.Exit = t.Enter
	}
	return t
}

// newRule is e's Rule.
func (e *Entitlement) newRule() *Rule {
	return &Rule{ID: e.ID, Dimension: e.Dimension, Endpoint: "*", Algorithm: algorithm.Balance,
		Window: e.Period.Unit.Nominal(), Calendar: e.Period, FailMode: e.FailMode, Entitlement: e}
}

// EntitlementThresholds are the crossings of a balance worth an event (and a webhook), each
// told once per period: the share of the period's grants used, the balance falling below an
// amount, a grant due to expire within a duration. Each list is ascending.
type EntitlementThresholds struct {
	UsedPercent    []int
	BalanceBelow   []int64
	ExpiringWithin []time.Duration
}

// DocEntitlement is an entitlement in a Document.
type DocEntitlement struct {
	ID        string   `yaml:"id" json:"id"`
	Dimension string   `yaml:"dimension" json:"dimension"`
	Endpoints []string `yaml:"endpoints,omitempty" json:"endpoints,omitempty"`
	// Period is 1d, 1w, 1mo or 1y; Timezone and AnchorDay as a calendar rule's.
	Period    string `yaml:"period" json:"period"`
	Timezone  string `yaml:"timezone,omitempty" json:"timezone,omitempty"`
	AnchorDay Scalar `yaml:"anchor_day,omitempty" json:"anchor_day,omitempty"`
	// Mode is hard (the default: deny at zero) or soft (allow, and count the overage).
	Mode       string `yaml:"mode,omitempty" json:"mode,omitempty"`
	OverageCap Scalar `yaml:"overage_cap,omitempty" json:"overage_cap,omitempty"`
	// FailMode is open (the default) or closed: a balance has no local twin.
	FailMode   string                    `yaml:"fail_mode,omitempty" json:"fail_mode,omitempty"`
	Thresholds *DocEntitlementThresholds `yaml:"thresholds,omitempty" json:"thresholds,omitempty"`
}

// DocEntitlementThresholds are an entitlement's thresholds in a Document.
type DocEntitlementThresholds struct {
	UsedPercent    []Scalar `yaml:"used_percent,omitempty" json:"used_percent,omitempty"`
	BalanceBelow   []Scalar `yaml:"balance_below,omitempty" json:"balance_below,omitempty"`
	ExpiringWithin []string `yaml:"expiring_within,omitempty" json:"expiring_within,omitempty"`
}

// entitlementsOf validates a document's entitlements; rules holds the id of every rule, which
// no entitlement may take: a check reports both under their ids.
func entitlementsOf(p *problems, docs []DocEntitlement, rules map[string]bool) []Entitlement {
	out := make([]Entitlement, 0, len(docs))
	seen := map[string]bool{}
	for i, d := range docs {
		where := fmt.Sprintf("entitlements[%d]", i)
		e, ok := entitlementOf(p, where, d)
		switch {
		case !ok:
			continue
		case seen[e.ID]:
			p.add(where, "id: %q is used by more than one entitlement", e.ID)
			continue
		case rules[e.ID]:
			p.add(where, "id: %q is a rule's id; a check reports rules and entitlements by id, so each needs its own", e.ID)
			continue
		}
		seen[e.ID] = true
		out = append(out, e)
	}
	for i := range out {
		out[i].rule = out[i].newRule()
	}
	return out
}

func entitlementOf(p *problems, where string, d DocEntitlement) (Entitlement, bool) {
	n := len(p.list)
	e := Entitlement{ID: d.ID, Endpoints: d.Endpoints, OverageCap: NoCap}
	if !nameRE.MatchString(d.ID) {
		p.add(where, "id: required, and must match %s", nameRE)
	}
	e.Dimension, e.Key = entitlementDimension(p, where, d.Dimension)
	for j, pat := range d.Endpoints {
		if err := ValidatePattern(pat); err != nil {
			p.add(where, "endpoints[%d]: %v", j, err)
		}
	}
	unit, ok := calendar.ParseUnit(strings.TrimSpace(d.Period))
	if !ok {
		p.add(where, "period: want 1d, 1w, 1mo or 1y, got %q", d.Period)
	}
	z := zoneOf(p, where, d.Timezone, d.AnchorDay)
	if d.AnchorDay != "" && ok && unit != calendar.Month {
		p.add(where, "anchor_day: only monthly periods (1mo) have one; period is %s", unit)
	}
	e.Period = calendar.Period{Unit: unit, Location: z.Location, AnchorDay: z.AnchorDay}
	if e.Period.Location == nil {
		e.Period.Location = time.UTC
	}
	switch d.Mode {
	case "", "hard":
		if d.OverageCap != "" {
			p.add(where, "overage_cap: only a soft entitlement has overage; mode is hard")
		}
	case "soft":
		e.Soft = true
		if d.OverageCap != "" {
			e.OverageCap = amountOf(p, where, "overage_cap", d.OverageCap, 0)
		}
	default:
		p.add(where, "mode: want hard or soft, got %q", d.Mode)
	}
	if d.Thresholds != nil {
		e.Thresholds = d.Thresholds.thresholds(p, where)
	}
	switch d.FailMode {
	case "", "open":
		e.FailMode = FailOpen
	case "closed":
		e.FailMode = FailClosed
	default:
		p.add(where, "fail_mode: want open or closed, got %q (a balance lives only in Redis: no checker can decide it locally)", d.FailMode)
	}
	return e, len(p.list) == n
}

// entitlementDimension validates the kind of subject that holds an entitlement's balances.
func entitlementDimension(p *problems, where, name string) (Dimension, string) {
	switch {
	case name == "":
		p.add(where, "dimension: required (user, apikey, org, or a custom dimension's name)")
	case customDimension(name):
		return DimensionDescriptor, name
	default:
		dim, err := ParseDimension(name)
		switch {
		case err != nil:
			p.add(where, "dimension: %v", err)
		case dim != DimensionUser && dim != DimensionAPIKey && dim != DimensionOrg:
			p.add(where, "dimension: %s subjects hold no balances (want user, apikey, org, or a custom dimension)", dim)
		}
		return dim, ""
	}
	return 0, ""
}

// amountOf validates an amount of an entitlement: a whole number from least to MaxAmount.
func amountOf(p *problems, where, field string, s Scalar, least int64) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(string(s)), 10, 64)
	if err != nil || n < least || n > MaxAmount {
		p.add(where, "%s: want a whole number from %d to %d, got %q", field, least, int64(MaxAmount), s)
		return 0
	}
	return n
}

func (d *DocEntitlementThresholds) thresholds(p *problems, where string) EntitlementThresholds {
	var t EntitlementThresholds
	where += ": thresholds"
	if len(d.UsedPercent) > MaxThresholds || len(d.BalanceBelow) > MaxThresholds || len(d.ExpiringWithin) > MaxThresholds {
		p.add(where, "thresholds: at most %d of each kind", MaxThresholds)
		return t
	}
	for i, s := range d.UsedPercent {
		n, err := strconv.Atoi(strings.TrimSpace(string(s)))
		if err != nil || n < 1 || n > 100 {
			p.add(where, "used_percent[%d]: want a percentage from 1 to 100, got %q", i, s)
			continue
		}
		t.UsedPercent = append(t.UsedPercent, n)
	}
	for i, s := range d.BalanceBelow {
		t.BalanceBelow = append(t.BalanceBelow, amountOf(p, where, fmt.Sprintf("balance_below[%d]", i), s, 1))
	}
	for i, s := range d.ExpiringWithin {
		dur, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || dur <= 0 || dur > 366*24*time.Hour {
			p.add(where, "expiring_within[%d]: want a duration from 1s to 8784h (366 days), got %q", i, s)
			continue
		}
		t.ExpiringWithin = append(t.ExpiringWithin, dur)
	}
	slices.Sort(t.UsedPercent)
	slices.Sort(t.BalanceBelow)
	slices.Sort(t.ExpiringWithin)
	if len(slices.Compact(slices.Clone(t.UsedPercent))) != len(t.UsedPercent) ||
		len(slices.Compact(slices.Clone(t.BalanceBelow))) != len(t.BalanceBelow) ||
		len(slices.Compact(slices.Clone(t.ExpiringWithin))) != len(t.ExpiringWithin) {
		p.add(where, "thresholds: a threshold is listed twice")
	}
	return t
}

// Burns reports whether a check of endpoint burns e without naming it.
func (e *Entitlement) Burns(endpoint string) bool {
	for _, pat := range e.Endpoints {
		if patternMatches(pat, endpoint) {
			return true
		}
	}
	return false
}

// patternMatches reports whether endpoint, in normal form, matches a rule pattern: "*", an
// exact path, or a prefix ending in "/*" (which matches the prefix itself and below it).
func patternMatches(pattern, endpoint string) bool {
	base, prefix := strings.CutSuffix(pattern, "/*")
	switch {
	case pattern == "*":
		return true
	case !prefix:
		return endpoint == pattern
	}
	return endpoint == base || strings.HasPrefix(endpoint, base+"/")
}

// Entitlement returns the entitlement id names.
func (s *Set) Entitlement(id string) (*Entitlement, bool) {
	e, ok := s.entitlementByID[id]
	return e, ok
}

// HasEntitlements reports whether the set declares an entitlement: its checks need the clock,
// to find the periods their balances are burned in.
func (s *Set) HasEntitlements() bool { return len(s.entitlements) > 0 }

// Entitlements returns the set's entitlements in document order. Do not modify them.
func (s *Set) Entitlements() []Entitlement { return s.entitlements }
