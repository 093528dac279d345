package rules

import (
	"math"
	"regexp"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
)

// Override changes limits for a while: a subject's, a tier's or one rule's. Limit replaces the
// limit (the most specific override wins); Multiplier scales it (every matching multiplier
// applies, so a penalty and a tier's load shedding compound). Buckets are keyed without the
// limit, so what a subject consumed carries over a change: 90 used of 100 raised to 200 leaves
// 110.
type Override struct {
	ID string `json:"id"`
	// The target: Dimension and Identifier name a subject; else Tier names a tier; else RuleID
	// alone names a rule. With a subject or a tier, RuleID narrows the override to that rule.
	Dimension  string  `json:"dimension,omitempty"`
	Identifier string  `json:"identifier,omitempty"`
	Tier       string  `json:"tier,omitempty"`
	RuleID     string  `json:"rule_id,omitempty"`
	Limit      int64   `json:"limit,omitempty"`
	Multiplier float64 `json:"multiplier,omitempty"`
	Reason     string  `json:"reason"`
	Creator    string  `json:"creator"`
	// Source is who made it: "admin", "penalty" or "tier_protection".
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Target names what the override applies to: "subject", "tier" or "rule".
func (o *Override) Target() string {
	switch {
	case o.Dimension != "" || o.Identifier != "":
		return "subject"
	case o.Tier != "":
		return "tier"
	}
	return "rule"
}

// Bounds of an override.
const (
	MaxOverrideDuration = 366 * 24 * time.Hour
	MaxMultiplier       = 1000
	MaxReasonLen        = 1024
)

var overrideIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_=-]{0,127}$`)

// ValidateOverride checks o against the set's rules and tiers, naming the first field at fault.
func (s *Set) ValidateOverride(o *Override) error {
	switch {
	case !overrideIDRE.MatchString(o.ID):
		return field.Errorf("id", "must match %s", overrideIDRE)
	case o.Limit != 0 && o.Multiplier != 0:
		return field.Errorf("limit", "give limit or multiplier, not both")
	case o.Limit == 0 && o.Multiplier == 0:
		return field.Errorf("limit", "give a limit (1 to %d) or a multiplier", MaxLimit)
	case o.Limit < 0 || o.Limit > MaxLimit:
		return field.Errorf("limit", "want a whole number from 1 to %d, got %d", MaxLimit, o.Limit)
	case o.Multiplier < 0 || o.Multiplier > MaxMultiplier || math.IsNaN(o.Multiplier):
		return field.Errorf("multiplier", "want a number above 0 and at most %d, got %v", MaxMultiplier, o.Multiplier)
	case o.Reason == "":
		return field.Errorf("reason", "required: say why, for the audit")
	case len(o.Reason) > MaxReasonLen || !utf8.ValidString(o.Reason):
		return field.Errorf("reason", "at most %d bytes of valid UTF-8", MaxReasonLen)
	case o.ExpiresAt.IsZero() || !o.ExpiresAt.After(o.CreatedAt):
		return field.Errorf("duration", "required: a positive Go duration such as 10m or 24h")
	case o.ExpiresAt.Sub(o.CreatedAt) > MaxOverrideDuration:
		return field.Errorf("duration", "at most %s", MaxOverrideDuration)
	}
	var rule *Rule
	if o.RuleID != "" {
		r, ok := s.byID[o.RuleID]
		if !ok {
			return field.Errorf("rule_id", "no rule has id %q", o.RuleID)
		}
		rule = r
	}
	switch o.Target() {
	case "subject":
		d, err := ParseDimension(o.Dimension)
		switch {
		case err != nil || d == DimensionGlobal:
			return field.Errorf("dimension", "want user, ip or apikey, got %q (a global rule is overridden by its rule_id)", o.Dimension)
		case o.Identifier == "" || len(o.Identifier) > MaxIdentifierLen || !utf8.ValidString(o.Identifier):
			return field.Errorf("identifier", "must be 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
		case o.Tier != "":
			return field.Errorf("tier", "give a subject or a tier, not both")
		case rule != nil && rule.Dimension != d:
			return field.Errorf("rule_id", "rule %q counts per %s, not per %s", rule.ID, rule.Dimension, d)
		}
	case "tier":
		if !s.HasTier(o.Tier) {
			return field.Errorf("tier", "%q is not a configured tier", o.Tier)
		}
	default:
		if rule == nil {
			return field.Errorf("rule_id", "required: an override targets a subject (dimension, identifier), a tier or a rule")
		}
	}
	return nil
}

type subjectKey struct {
	dim Dimension
	id  string
}

// overrideIndex finds the overrides of a check with map lookups.
type overrideIndex struct {
	all       []Override
	bySubject map[subjectKey][]*Override
	byTier    map[string][]*Override
	byRule    map[string][]*Override
}

// WithOverrides returns a copy of s that applies ovs (validated by the caller with
// ValidateOverride; ones that name a rule or tier s lacks are ignored). Expired overrides never
// apply, whether or not they have been removed yet.
func (s *Set) WithOverrides(ovs []Override) *Set {
	c := *s
	c.ovr = nil
	if len(ovs) == 0 {
		return &c
	}
	idx := &overrideIndex{
		all:       slices.Clone(ovs),
		bySubject: map[subjectKey][]*Override{},
		byTier:    map[string][]*Override{},
		byRule:    map[string][]*Override{},
	}
	for i := range idx.all {
		o := &idx.all[i]
		if s.ValidateOverride(o) != nil {
			continue
		}
		switch o.Target() {
		case "subject":
			d, _ := ParseDimension(o.Dimension)
			k := subjectKey{d, o.Identifier}
			idx.bySubject[k] = append(idx.bySubject[k], o)
		case "tier":
			idx.byTier[o.Tier] = append(idx.byTier[o.Tier], o)
		default:
			idx.byRule[o.RuleID] = append(idx.byRule[o.RuleID], o)
		}
	}
	c.ovr = idx
	return &c
}

// Overrides returns the overrides the set applies (expired ones included until removed).
func (s *Set) Overrides() []Override {
	if s.ovr == nil {
		return nil
	}
	return s.ovr.all
}

// HasOverrides reports whether any override may change a limit; when false, Effective is the
// rule's (or user's) own limit and the check path skips it.
func (s *Set) HasOverrides() bool { return s.ovr != nil }

// NextExpiry is the earliest expiry after now of the set's overrides (zero when none): the
// instant its effective limits change by themselves.
func (s *Set) NextExpiry(now time.Time) time.Time {
	var next time.Time
	if s.ovr == nil {
		return next
	}
	for i := range s.ovr.all {
		if e := s.ovr.all[i].ExpiresAt; e.After(now) && (next.IsZero() || e.Before(next)) {
			next = e
		}
	}
	return next
}

// Effective returns rule r's limit and burst for a subject (dimension dim, id) of tier at now:
// custom (a user's own limit, 0 for none) replaces the rule's, then the overrides apply (the
// most specific limit replaces it, every multiplier scales it). The burst follows the limit when
// the file left it to default, and scales with it. A calendar rule's periods are Period's. It
// does not allocate.
func (s *Set) Effective(r *Rule, dim Dimension, id, tier string, custom int64, now time.Time) (limit, burst int64) {
	mult := 1.0
	if s.ovr != nil {
		custom, mult = s.overridden(r, dim, id, tier, custom, now)
	}
	limit, burst = r.Limit, r.Burst
	if custom > 0 && custom != r.Limit {
		if r.Burst == r.Limit || !r.Algorithm.HasBurst() {
			burst = custom
		}
		limit = custom
	}
	if mult != 1 {
		limit, burst = scale(limit, mult), scale(burst, mult)
	}
	return limit, burst
}

// Period is how calendar rule r cuts time for a subject (dimension dim, id) of tier: the rule's
// period in the user's time zone and anchor day, else its tier's, else the rule's own.
func (s *Set) Period(r *Rule, dim Dimension, id, tier string) calendar.Period {
	p := r.Calendar
	if t, ok := s.tiers[tier]; ok {
		p = t.Zone.apply(p)
	}
	if dim == DimensionUser {
		if u, ok := s.users[id]; ok {
			p = u.Zone.apply(p)
		}
	}
	return p
}

// overridden returns the limit that replaces r's for the subject (custom when no override
// names one) and the product of the multipliers that scale it.
func (s *Set) overridden(r *Rule, dim Dimension, id, tier string, custom int64, now time.Time) (int64, float64) {
	var best *Override
	bestRank := 0
	mult := 1.0
	visit := func(os []*Override, rankAny, rankRule int) {
		for _, o := range os {
			if !o.ExpiresAt.After(now) || (o.RuleID != "" && o.RuleID != r.ID) {
				continue
			}
			if o.Multiplier > 0 {
				mult *= o.Multiplier
				continue
			}
			rank := rankAny
			if o.RuleID != "" {
				rank = rankRule
			}
			if rank > bestRank || (rank == bestRank && o.CreatedAt.After(best.CreatedAt)) {
				best, bestRank = o, rank
			}
		}
	}
	if dim != DimensionGlobal {
		visit(s.ovr.bySubject[subjectKey{dim, id}], 4, 5)
	}
	visit(s.ovr.byTier[tier], 2, 3)
	visit(s.ovr.byRule[r.ID], 1, 1)
	if best != nil {
		custom = best.Limit
	}
	return custom, mult
}

func scale(n int64, f float64) int64 {
	return int64(min(MaxLimit, max(1, math.Round(float64(n)*f))))
}
