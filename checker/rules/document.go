package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/internal/yamldoc"
)

// Document is a rules document as people write it: the YAML rules file, the value kept in the
// rule store and the admin API's JSON are all this one form. Its scalars are Scalar so that a
// number or a string decodes alike and validation (Compile), not decoding, names a bad field.
type Document struct {
	DefaultTier string             `yaml:"default_tier,omitempty" json:"default_tier,omitempty"`
	Tiers       map[string]DocTier `yaml:"tiers,omitempty" json:"tiers,omitempty"`
	Users       map[string]DocUser `yaml:"users,omitempty" json:"users,omitempty"`
	APIKeys     map[string]DocKey  `yaml:"api_keys,omitempty" json:"api_keys,omitempty"`
	Warnings    *DocWarnings       `yaml:"warnings,omitempty" json:"warnings,omitempty"`
	Policies    *DocPolicies       `yaml:"policies,omitempty" json:"policies,omitempty"`
	Rules       []DocRule          `yaml:"rules" json:"rules"`
	// Exemptions let trusted subjects' checks past chosen rules (exemption.go).
	Exemptions []DocExemption `yaml:"exemptions,omitempty" json:"exemptions,omitempty"`
	// Entitlements are the balances sold by grants (entitlement.go).
	Entitlements []DocEntitlement `yaml:"entitlements,omitempty" json:"entitlements,omitempty"`

	// lines are where the parts of a document read from YAML (or JSON) text were written:
	// "rules[0]", `users["42"]`, "policies.tier_protection[1]", `rule "orders"`, … to their
	// line, so that Compile's problems name it. Nil for a document built otherwise.
	lines yamldoc.Lines
}

// DocTier is a tier of a Document.
type DocTier struct {
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Timezone and AnchorDay are the tier's subjects' own for calendar rules (DocRule's).
	Timezone  string `yaml:"timezone,omitempty" json:"timezone,omitempty"`
	AnchorDay Scalar `yaml:"anchor_day,omitempty" json:"anchor_day,omitempty"`
}

// DocUser is a user's tier and custom limits (rule id to limit).
type DocUser struct {
	Tier   string            `yaml:"tier,omitempty" json:"tier,omitempty"`
	Limits map[string]Scalar `yaml:"limits,omitempty" json:"limits,omitempty"`
	// Timezone and AnchorDay are the user's own for calendar rules (DocRule's).
	Timezone  string `yaml:"timezone,omitempty" json:"timezone,omitempty"`
	AnchorDay Scalar `yaml:"anchor_day,omitempty" json:"anchor_day,omitempty"`
	// Org is the organisation the user belongs to: its org rules count the user's checks too.
	Org string `yaml:"org,omitempty" json:"org,omitempty"`
}

// DocKey is an API key's tier: the tier of checks whose apikey subject it is, unless their
// user has a tier of its own.
type DocKey struct {
	Tier string `yaml:"tier,omitempty" json:"tier,omitempty"`
	// Org is the organisation the key belongs to, for checks whose user has none.
	Org string `yaml:"org,omitempty" json:"org,omitempty"`
}

// DocRule is one rule of a Document.
type DocRule struct {
	ID        string       `yaml:"id" json:"id"`
	Dimension string       `yaml:"dimension" json:"dimension"`
	Endpoint  string       `yaml:"endpoint" json:"endpoint"`
	Tier      string       `yaml:"tier,omitempty" json:"tier,omitempty"`
	Algorithm string       `yaml:"algorithm,omitempty" json:"algorithm,omitempty"` // none for an unlimited rule
	Limit     Scalar       `yaml:"limit,omitempty" json:"limit,omitempty"`
	Window    Scalar       `yaml:"window,omitempty" json:"window,omitempty"`
	Burst     Scalar       `yaml:"burst,omitempty" json:"burst,omitempty"`
	Shadow    Scalar       `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	FailMode  string       `yaml:"fail_mode,omitempty" json:"fail_mode,omitempty"`
	Warning   *DocWarnings `yaml:"warning,omitempty" json:"warning,omitempty"`
	// IPv6Prefix and IPv4Prefix group an ip rule's addresses into one bucket per network of
	// that many leading bits (default 64 and 32); ip rules only.
	IPv6Prefix Scalar `yaml:"ipv6_prefix,omitempty" json:"ipv6_prefix,omitempty"`
	IPv4Prefix Scalar `yaml:"ipv4_prefix,omitempty" json:"ipv4_prefix,omitempty"`
	// Lease makes a global fixed_window rule's budget leased: each checker takes slices of
	// its window from Redis and decides checks from them in process (Rule.Lease).
	Lease *DocLease `yaml:"lease,omitempty" json:"lease,omitempty"`
	// Timezone (an IANA name, default UTC) and AnchorDay (1-31, default 1; months only) place
	// the periods of a calendar window (1d, 1w, 1mo, 1y).
	Timezone  string `yaml:"timezone,omitempty" json:"timezone,omitempty"`
	AnchorDay Scalar `yaml:"anchor_day,omitempty" json:"anchor_day,omitempty"`
	// Descriptor is the descriptor a rule of dimension descriptor matches (Rule.Descriptor);
	// a custom dimension (dimension: tenant) is the descriptor of its one key.
	Descriptor []DocEntry `yaml:"descriptor,omitempty" json:"descriptor,omitempty"`
	// Name, Replaces, Unlimited, CountDenied and QuotaMode are a descriptor rule's (Rule's), as Envoy's
	// reference service configures them.
	Name      string   `yaml:"name,omitempty" json:"name,omitempty"`
	Replaces  []string `yaml:"replaces,omitempty" json:"replaces,omitempty"`
	Unlimited Scalar   `yaml:"unlimited,omitempty" json:"unlimited,omitempty"`
	// MaxValues bounds the distinct values a descriptor rule counts per window on a checker
	// (Rule.MaxValues).
	MaxValues   Scalar `yaml:"max_values,omitempty" json:"max_values,omitempty"`
	CountDenied Scalar `yaml:"count_denied,omitempty" json:"count_denied,omitempty"`
	// QuotaMode is Envoy's quota_mode (Rule.QuotaMode).
	QuotaMode Scalar `yaml:"quota_mode,omitempty" json:"quota_mode,omitempty"`
	// OnLimit is what the rule does to a check past its limit: "deny" (the default), or
	// "delay" (gcra and leaky_bucket: a queue), which allows it after a wait of at most
	// MaxDelay, a Go duration no longer than the window (Rule.MaxDelay).
	OnLimit  string `yaml:"on_limit,omitempty" json:"on_limit,omitempty"`
	MaxDelay Scalar `yaml:"max_delay,omitempty" json:"max_delay,omitempty"`
	// MaxOverage bounds what a reservation's settle charges the rule's bucket past its
	// estimate (Rule.MaxOverage).
	MaxOverage Scalar `yaml:"max_overage,omitempty" json:"max_overage,omitempty"`
	// CandidateOf makes the rule a candidate of the live rule of that id: evaluated on its
	// checks, never enforced, what it leaves out taken from it (candidate.go).
	CandidateOf string `yaml:"candidate_of,omitempty" json:"candidate_of,omitempty"`
}

// DocLease is a rule's lease: how many units a checker takes from Redis at a time.
type DocLease struct {
	Slice Scalar `yaml:"slice" json:"slice"`
}

// DocWarnings are warning thresholds: document-wide under warnings:, or a rule's own under
// warning:. Unset fields inherit.
type DocWarnings struct {
	Enter       Scalar `yaml:"enter,omitempty" json:"enter,omitempty"`
	Exit        Scalar `yaml:"exit,omitempty" json:"exit,omitempty"`
	QuietPeriod Scalar `yaml:"quiet_period,omitempty" json:"quiet_period,omitempty"`
}

// DocPolicies are the aggregator's automatic overrides.
type DocPolicies struct {
	Penalty        *DocPenalty         `yaml:"penalty,omitempty" json:"penalty,omitempty"`
	TierProtection []DocTierProtection `yaml:"tier_protection,omitempty" json:"tier_protection,omitempty"`
}

// DocPenalty: a subject throttled on a rule for more than Throttled of the last Within gets
// that rule's limit scaled by Factor for Duration.
type DocPenalty struct {
	Throttled Scalar `yaml:"throttled" json:"throttled"`
	Within    Scalar `yaml:"within" json:"within"`
	Factor    Scalar `yaml:"factor" json:"factor"`
	Duration  Scalar `yaml:"duration" json:"duration"`
}

// DocTierProtection: when Tier's allowed checks over the last Window exceed Capacity, its limits
// are scaled by Factor, for Duration at a time, until the rate falls back.
type DocTierProtection struct {
	Tier     string `yaml:"tier" json:"tier"`
	Capacity Scalar `yaml:"capacity" json:"capacity"`
	Window   Scalar `yaml:"window,omitempty" json:"window,omitempty"`
	Factor   Scalar `yaml:"factor" json:"factor"`
	Duration Scalar `yaml:"duration,omitempty" json:"duration,omitempty"`
}

// Scalar is a document's number, duration or boolean as written: JSON numbers and strings both
// decode into it, and it encodes back as a number or boolean when it reads as one.
type Scalar string

// UnmarshalJSON accepts a JSON number, string or boolean.
func (s *Scalar) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var str string
		if err := json.Unmarshal(b, &str); err != nil {
			return err
		}
		*s = Scalar(str)
		return nil
	}
	if string(b) == "null" {
		*s = ""
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v.(type) {
	case float64, bool:
		*s = Scalar(b)
		return nil
	}
	return fmt.Errorf("want a number, string or boolean, got %s", b)
}

// MarshalJSON writes numbers and booleans bare and anything else as a string.
func (s Scalar) MarshalJSON() ([]byte, error) {
	str := string(s)
	if str == "true" || str == "false" {
		return []byte(str), nil
	}
	if _, err := strconv.ParseFloat(str, 64); err == nil && json.Valid([]byte(str)) {
		return []byte(str), nil
	}
	return json.Marshal(str)
}

// Thresholds are a rule's warning-state thresholds (docs/warnings.md): a subject goes
// from normal to warning when its usage ratio exceeds Enter, back to normal when it falls below
// Exit (hysteresis), and from throttled straight back to normal after QuietPeriod without
// calls.
type Thresholds struct {
	Enter, Exit float64
	QuietPeriod time.Duration
}

// DefaultThresholds are the thresholds of a document that sets none: warning above 80% used,
// normal again below 70%, quiet after 30s.
var DefaultThresholds = Thresholds{Enter: 0.8, Exit: 0.7, QuietPeriod: 30 * time.Second}

// Enters reports whether a subject that used used of limit (the rule's limit per window, not
// its burst) is past Enter: the one test, shared by the checker's per-answer state and the
// aggregator's events, of when a subject goes from normal to warning.
func (t Thresholds) Enters(used, limit int64) bool {
	return float64(used) > t.Enter*float64(limit)
}

func (w *DocWarnings) thresholds(p *problems, where string, inherit Thresholds) Thresholds {
	t := inherit
	if w == nil {
		return t
	}
	bad := false
	ratio := func(field string, s Scalar, dst *float64) {
		if s == "" {
			return
		}
		v, err := strconv.ParseFloat(string(s), 64)
		if err != nil || v <= 0 || v > 1 {
			p.add(where, "%s: want a usage ratio above 0 and at most 1, got %q", field, s)
			bad = true
			return
		}
		*dst = v
	}
	ratio("enter", w.Enter, &t.Enter)
	ratio("exit", w.Exit, &t.Exit)
	if w.QuietPeriod != "" {
		d, err := parsePositiveDuration(w.QuietPeriod)
		if err != nil {
			p.add(where, "quiet_period: %v", err)
		} else {
			t.QuietPeriod = d
		}
	}
	// Inherited thresholds were checked where they were set: a pair is reported once, where
	// one of its values is written, and not when one of them is refused already.
	if (w.Enter != "" || w.Exit != "") && !bad && t.Exit >= t.Enter {
		p.add(where, "exit: %v must be below enter (%v), or states would flap around one threshold", t.Exit, t.Enter)
	}
	return t
}

// Policies are the aggregator's automatic overrides, validated.
type Policies struct {
	Penalty        *Penalty
	TierProtection []TierProtection
}

// Penalty scales a subject's limit on a rule by Factor for Duration once it has been throttled
// on that rule for more than Throttled of the last Within (abuse dampening).
type Penalty struct {
	Throttled, Within time.Duration
	Factor            float64
	Duration          time.Duration
}

// TierProtection scales Tier's limits by Factor while its allowed checks over the last Window
// exceed Capacity (load shedding); its one override lasts Duration and is renewed in place
// while the rate stays above, never stacked (multipliers compound).
type TierProtection struct {
	Tier     string
	Capacity int64
	Window   time.Duration
	Factor   float64
	Duration time.Duration
}

func (d *DocPolicies) policies(p *problems, tiers map[string]Tier) Policies {
	var pol Policies
	if d == nil {
		return pol
	}
	if pe := d.Penalty; pe != nil {
		where := "policies.penalty"
		var out Penalty
		var err error
		if out.Throttled, err = parsePositiveDuration(pe.Throttled); err != nil {
			p.add(where, "throttled: %v", err)
		}
		if out.Within, err = parsePositiveDuration(pe.Within); err != nil {
			p.add(where, "within: %v", err)
		} else if out.Throttled >= out.Within {
			p.add(where, "throttled: %v must be shorter than within (%v)", out.Throttled, out.Within)
		}
		if out.Factor, err = parseFactor(pe.Factor); err != nil {
			p.add(where, "factor: %v", err)
		}
		if out.Duration, err = parsePositiveDuration(pe.Duration); err != nil {
			p.add(where, "duration: %v", err)
		}
		pol.Penalty = &out
	}
	seen := map[string]bool{}
	for i, tp := range d.TierProtection {
		where := fmt.Sprintf("policies.tier_protection[%d]", i)
		out := TierProtection{Tier: tp.Tier, Window: time.Minute, Duration: time.Minute}
		if _, ok := tiers[tp.Tier]; !ok {
			p.add(where, "tier: %q is not declared under tiers:", tp.Tier)
		} else if seen[tp.Tier] {
			p.add(where, "tier: %q is protected twice", tp.Tier)
		}
		seen[tp.Tier] = true
		var err error
		if out.Capacity, err = parseCount(string(tp.Capacity)); err != nil {
			p.add(where, "capacity: %v", err)
		}
		if tp.Window != "" {
			if out.Window, err = parsePositiveDuration(tp.Window); err != nil {
				p.add(where, "window: %v", err)
			}
		}
		if out.Factor, err = parseFactor(tp.Factor); err != nil {
			p.add(where, "factor: %v", err)
		}
		if tp.Duration != "" {
			if out.Duration, err = parsePositiveDuration(tp.Duration); err != nil {
				p.add(where, "duration: %v", err)
			}
		}
		pol.TierProtection = append(pol.TierProtection, out)
	}
	return pol
}

// parseFactor reads a policy's scaling factor: a policy only ever tightens.
func parseFactor(s Scalar) (float64, error) {
	v, err := strconv.ParseFloat(string(s), 64)
	if err != nil || v <= 0 || v >= 1 {
		return 0, fmt.Errorf("want a factor above 0 and below 1, got %q", s)
	}
	return v, nil
}

func parsePositiveDuration(s Scalar) (time.Duration, error) {
	d, err := time.ParseDuration(string(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive Go duration such as 30s or 5m, got %q", s)
	}
	return d, nil
}

// WithoutUsers returns a copy of the document without its users (kept apart by the rule store).
func (d *Document) WithoutUsers() *Document {
	c := *d
	c.Users = nil
	return &c
}
