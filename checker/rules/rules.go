// Package rules holds quotaflow's rule model: the rules, tiers and users of a rules file,
// validated as a whole so that a bad file fails at start-up with errors naming the rule and the
// field, and compiled into a Set that finds the rules applying to a request without locks or
// allocation.
package rules

import (
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// Dimension is the kind of subject a rule counts for.
type Dimension uint8

// DefaultMaxValues is a descriptor rule's MaxValues when its file names none.
const DefaultMaxValues = 100_000

// The dimensions. Global rules apply to every request, counted once for all callers. Org
// rules count once per organisation for all its members: a check's org subject is its user's
// org, else its API key's (Set.OrgOf), never one a caller names.
const (
	DimensionUser Dimension = iota + 1
	DimensionIP
	DimensionAPIKey
	DimensionGlobal
	DimensionOrg
	// DimensionDescriptor counts per descriptor (descriptor.go): custom dimensions
	// (dimension: tenant) and Envoy descriptors, an ordered list of key and value entries.
	DimensionDescriptor

	lastDimension = DimensionDescriptor
)

var dimensionNames = [...]string{
	DimensionUser:       "user",
	DimensionIP:         "ip",
	DimensionAPIKey:     "apikey",
	DimensionGlobal:     "global",
	DimensionOrg:        "org",
	DimensionDescriptor: "descriptor",
}

// Own reports whether the dimension's subjects are single callers (a user, an API key), whose
// buckets no other caller shares; a global, org, IP or custom dimension's bucket is shared.
func (d Dimension) Own() bool { return d == DimensionUser || d == DimensionAPIKey }

// String returns the dimension's name as written in rules files ("apikey").
func (d Dimension) String() string {
	if d.Valid() {
		return dimensionNames[d]
	}
	return fmt.Sprintf("dimension(%d)", uint8(d))
}

// Valid reports whether d is one of the dimensions.
func (d Dimension) Valid() bool { return d >= DimensionUser && d <= lastDimension }

// ParseDimension returns the dimension named s.
func ParseDimension(s string) (Dimension, error) {
	for d := DimensionUser; d <= lastDimension; d++ {
		if dimensionNames[d] == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown dimension %q (want user, ip, apikey, global, org or descriptor)", s)
}

// FailMode decides a rule's answer while Redis cannot be reached.
type FailMode uint8

// The fail modes. FailOpen is the default: a rate limiter that is down should not take its
// users' services down with it.
const (
	FailOpen FailMode = iota + 1
	FailClosed
	FailLocal
)

var failModeNames = [...]string{FailOpen: "open", FailClosed: "closed", FailLocal: "local"}

// String returns the fail mode's name ("open", "closed" or "local").
func (f FailMode) String() string {
	if f >= FailOpen && f <= FailLocal {
		return failModeNames[f]
	}
	return fmt.Sprintf("failmode(%d)", uint8(f))
}

// ParseFailMode returns the fail mode named s.
func ParseFailMode(s string) (FailMode, error) {
	for f := FailOpen; f <= FailLocal; f++ {
		if failModeNames[f] == s {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown fail mode %q (want open, closed or local)", s)
}

// Rule is one validated rate limit.
type Rule struct {
	ID        string
	Dimension Dimension
	// Endpoint is an exact path ("/api/v1/orders"), a prefix ending in "/*" ("/api/*", which
	// also matches "/api"), or "*" for every endpoint; paths are in normal form
	// (urlpath.Normalize), as the endpoints they match.
	Endpoint  string
	Tier      string // empty: every tier
	Algorithm algorithm.ID
	Limit     int64
	Window    time.Duration
	// Burst is the capacity of token bucket, leaky bucket and GCRA (Limit when not set in the
	// file); for window algorithms it equals Limit.
	Burst int64
	// MaxOverage is the most a reservation's settle charges the rule's bucket past the
	// estimate, 0 for no bound of the rule's own. Whatever it says, a bucket no one caller owns
	// (Dimension.Own false) takes an overage only as far as it fits and at most the estimate
	// again, so that one caller's settle cannot deny everyone.
	MaxOverage int64
	Shadow     bool
	FailMode   FailMode
	// IPv6Prefix and IPv4Prefix are the leading bits of an address that an ip rule counts by:
	// every address of one network shares a bucket, since a client owns a whole IPv6 /64 (and
	// may own more). 0 means DefaultIPv6Prefix and DefaultIPv4Prefix.
	IPv6Prefix, IPv4Prefix uint8
	// Allotment is the slice a checker leases of this rule's window at a time, 0 for a rule that
	// is not leased: a global fixed_window rule whose limit is far above what one Redis core
	// decides, whose checks each checker then decides from its own slice without a Redis call
	// (checker's lease table gives the argument that this never admits more than the limit).
	// At most Allotment units per checker may go unused in a window.
	Allotment int64
	// Calendar, when its Unit is set, makes the rule's windows calendar periods (a window of
	// 1d, 1w, 1mo or 1y in the file): days, weeks, months or years from local midnight in
	// Calendar.Location, months from Calendar.AnchorDay. Window is then the unit's nominal
	// length. A subject's tier or user may carry its own time zone and anchor day
	// (Set.Effective). Only fixed_window rules have one.
	Calendar calendar.Period
	// Descriptor is what a rule of DimensionDescriptor matches (descriptor.go).
	Descriptor []Entry
	// Shared marks the entries of Descriptor, wildcard values, whose matching values share one
	// bucket: the descriptor is counted under the wildcard (Envoy's share_threshold); nil for
	// none.
	Shared []bool
	// Name is the name Replaces of other rules refer to (Envoy's rate_limit.name), reported
	// to Envoy as the limit's name; empty for none.
	Name string
	// Replaces names the rules (by Name) this one replaces: a request of several descriptors
	// whose descriptors match this rule and a replaced one is not checked against the
	// replaced one (Envoy's replaces).
	Replaces []string
	// MaxValues bounds the distinct descriptors (a custom dimension's values: tenants) a
	// descriptor rule counts in one window on one checker: past it a check naming a new one is
	// refused, so that a caller naming a new value per request cannot make a bucket each
	// without end. DefaultMaxValues when the file names none; 0 on other rules.
	MaxValues int64
	// Unlimited is a descriptor rule that matches and never limits: the descriptor is
	// answered with no limit, and no other rule applies to it.
	Unlimited bool
	// CountDenied counts every hit, allowed or not (bucket.Request.Count): the reference
	// service's fixed window, whose count goes on past the limit. fixed_window only.
	CountDenied bool
	// Entitlement is set on an entitlement's Rule (Entitlement.Rule), nil on the rules of
	// the document.
	Entitlement *Entitlement
	// QuotaMode is a descriptor rule in Envoy's quota mode: like a shadow rule it never denies
	// (Shadow is set with it), and the RLS transport answers its over-the-limit descriptor OK
	// with its limit and nothing remaining, as the reference does.
	QuotaMode bool
	// MaxDelay, when set (on_limit: delay in the file), makes the rule delay the checks past
	// its limit instead of denying them: a gcra or leaky_bucket rule used as a queue, whose
	// checks are allowed after a wait that spaces them exactly window/limit apart, and denied
	// when that wait would pass MaxDelay (at most the window). 0: the rule denies.
	MaxDelay time.Duration
	// CandidateOf is the id of the live rule this one is a candidate of (candidate.go), empty
	// for a rule that is none. A candidate is Shadow too: never enforced.
	CandidateOf string
	// Candidates are the candidates of this rule, in file order: planned with it, on its
	// checks, and never matched on their own.
	Candidates []*Rule
}

// WindowName is the window as a rules file writes it: a calendar unit (1mo), else a duration.
func (r *Rule) WindowName() string {
	if r.Calendar.Unit.Valid() {
		return r.Calendar.Unit.String()
	}
	return r.Window.String()
}

// The networks an ip rule counts by unless it names its own: an IPv6 /64, the least a site is
// assigned (RFC 6177) and what SLAAC clients pick their addresses in, and one IPv4 address.
const (
	DefaultIPv6Prefix = 64
	DefaultIPv4Prefix = 32
)

// PrefixBits returns the leading bits of an address that r counts by: of an IPv4 address when
// is4, else of an IPv6 one.
func (r *Rule) PrefixBits(is4 bool) int {
	switch {
	case is4 && r.IPv4Prefix != 0:
		return int(r.IPv4Prefix)
	case is4:
		return DefaultIPv4Prefix
	case r.IPv6Prefix != 0:
		return int(r.IPv6Prefix)
	}
	return DefaultIPv6Prefix
}

// User is a user's tier and custom limits, cached in memory.
type User struct {
	Tier string
	// Limits maps a rule id to the limit that replaces the rule's for this user.
	Limits map[string]int64
	// Zone is where the user lives: the time zone and anchor day of its calendar quotas,
	// before its tier's and the rule's.
	Zone Zone
	// Org is the organisation the user belongs to, whose org rules its checks also count
	// against (empty: none).
	Org string
}

// Tier is a named set of rules.
type Tier struct {
	Name        string
	Description string
	// Zone is the time zone and anchor day of its subjects' calendar quotas, before the
	// rule's.
	Zone Zone
}

// Zone is a subject's own time zone and monthly anchor day for calendar quotas; nil and 0 leave
// them to the next level (user, then tier, then rule).
type Zone struct {
	Location  *time.Location
	AnchorDay int
}

// apply returns p with z's settings in place of p's.
func (z Zone) apply(p calendar.Period) calendar.Period {
	if z.Location != nil {
		p.Location = z.Location
	}
	if z.AnchorDay != 0 && p.Unit == calendar.Month {
		p.AnchorDay = z.AnchorDay
	}
	return p
}
