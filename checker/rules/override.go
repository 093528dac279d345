package rules

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/calendar"
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

// FieldError is a value that broke a rule: Field names it as the API spells it.
type FieldError struct {
	Field, Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// ValidateOverride checks o against the set's rules and tiers, naming the first field at fault.
func (s *Set) ValidateOverride(o *Override) error {
	switch {
	case !overrideIDRE.MatchString(o.ID):
		return fieldErr("id", "must match %s", overrideIDRE)
	case o.Limit != 0 && o.Multiplier != 0:
		return fieldErr("limit", "give limit or multiplier, not both")
	case o.Limit == 0 && o.Multiplier == 0:
		return fieldErr("limit", "give a limit (1 to %d) or a multiplier", MaxLimit)
	case o.Limit < 0 || o.Limit > MaxLimit:
		return fieldErr("limit", "want a whole number from 1 to %d, got %d", MaxLimit, o.Limit)
	case o.Multiplier < 0 || o.Multiplier > MaxMultiplier || math.IsNaN(o.Multiplier):
		return fieldErr("multiplier", "want a number above 0 and at most %d, got %v", MaxMultiplier, o.Multiplier)
	case o.Reason == "":
		return fieldErr("reason", "required: say why, for the audit")
	case len(o.Reason) > MaxReasonLen || !utf8.ValidString(o.Reason):
		return fieldErr("reason", "at most %d bytes of valid UTF-8", MaxReasonLen)
	case o.ExpiresAt.IsZero() || !o.ExpiresAt.After(o.CreatedAt):
		return fieldErr("duration", "required: a positive Go duration such as 10m or 24h")
	case o.ExpiresAt.Sub(o.CreatedAt) > MaxOverrideDuration:
		return fieldErr("duration", "at most %s", MaxOverrideDuration)
	}
	var rule *Rule
	if o.RuleID != "" {
		r, ok := s.byID[o.RuleID]
		if !ok {
			return fieldErr("rule_id", "no rule has id %q", o.RuleID)
		}
		rule = r
	}
	switch o.Target() {
	case "subject":
		d, err := ParseDimension(o.Dimension)
		switch {
		case err != nil || d == DimensionGlobal:
			return fieldErr("dimension", "want user, ip or apikey, got %q (a global rule is overridden by its rule_id)", o.Dimension)
		case o.Identifier == "" || len(o.Identifier) > MaxIdentifierLen || !utf8.ValidString(o.Identifier):
			return fieldErr("identifier", "must be 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
		case o.Tier != "":
			return fieldErr("tier", "give a subject or a tier, not both")
		case rule != nil && rule.Dimension != d:
			return fieldErr("rule_id", "rule %q counts per %s, not per %s", rule.ID, rule.Dimension, d)
		}
	case "tier":
		if !s.HasTier(o.Tier) {
			return fieldErr("tier", "%q is not a configured tier", o.Tier)
		}
	default:
		if rule == nil {
			return fieldErr("rule_id", "required: an override targets a subject (dimension, identifier), a tier or a rule")
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

// Effective returns the bucket limit of rule r for a subject (dimension dim, id) of tier at
// now: custom (a user's own limit, 0 for none) replaces the rule's, then the overrides apply;
// a calendar rule's limit carries the periods around now in the subject's zone (Period). It does
// not allocate.
func (s *Set) Effective(r *Rule, key string, dim Dimension, id, tier string, custom int64, now time.Time) bucket.Limit {
	if r.Calendar.Unit.Valid() {
		l := s.effective(r, key, dim, id, tier, custom, now)
		l.Periods = s.Period(r, dim, id, tier).Around(now)
		return l
	}
	return s.effective(r, key, dim, id, tier, custom, now)
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

func (s *Set) effective(r *Rule, key string, dim Dimension, id, tier string, custom int64, now time.Time) bucket.Limit {
	if s.ovr == nil {
		return r.Bucket(key, custom)
	}
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
	l := r.Bucket(key, custom)
	if mult != 1 {
		l.Limit = scale(l.Limit, mult)
		l.Burst = scale(l.Burst, mult)
	}
	return l
}

func scale(n int64, f float64) int64 {
	return int64(min(MaxLimit, max(1, math.Round(float64(n)*f))))
}
