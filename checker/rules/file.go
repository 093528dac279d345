package rules

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/urlpath"
)

// Bounds on what a rules file may say. They keep keys short and arithmetic in Lua exact
// (microsecond times and counts stay far below 2^53).
const (
	MaxEndpointLen   = 1024
	MaxIdentifierLen = 256
	MaxLimit         = 1_000_000_000
	MinWindow        = time.Millisecond
	MaxWindow        = 366 * 24 * time.Hour
	// MaxHoldTTL bounds a concurrency rule's window: how long a place in flight is held
	// unless released.
	MaxHoldTTL = 24 * time.Hour
)

// ImplicitTier is the tier of a file that declares none.
const ImplicitTier = "default"

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Load reads and validates the rules file at path.
func Load(path string) (*Set, error) {
	_, s, err := LoadFile(path)
	return s, err
}

// LoadFile reads and validates the rules file at path, and returns its document too: with its
// users, which Set.Document leaves out, as a rule store is seeded.
func LoadFile(path string) (*Document, *Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read rules file: %w", err)
	}
	d, err := Decode(data)
	var s *Set
	if err == nil {
		s, err = d.Compile()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("rules file %s: %w", path, err)
	}
	return d, s, nil
}

// Parse validates a rules document (YAML, or JSON) and compiles it. Every problem is
// reported, each naming the rule (or tier, or user) and the field.
func Parse(data []byte) (*Set, error) {
	d, err := Decode(data)
	if err != nil {
		return nil, err
	}
	return d.Compile()
}

// Compile validates the document as a whole and compiles it into a Set.
func (d *Document) Compile() (*Set, error) {
	return d.compile(d.Users)
}

// CompileWithUsers is Compile with the users kept apart from the document (the rule store keeps
// each user under a key of its own); the document's own users: are ignored.
func (d *Document) CompileWithUsers(users map[string]DocUser) (*Set, error) {
	return d.compile(users)
}

func (d *Document) compile(docUsers map[string]DocUser) (*Set, error) {
	p := problems{lines: d.lines}
	tiers, defaultTier := d.tiers(&p)
	rules := make([]Rule, 0, len(d.Rules))
	declared := make(map[string]bool, len(d.Rules)) // every id, of valid rules or not
	uses := make(map[string]int, len(d.Rules))
	docs := withCandidates(&p, d.Rules)
	for i, fr := range docs {
		r, ok := fr.rule(&p, fmt.Sprintf("rules[%d]", i), tiers)
		if r.CandidateOf = fr.CandidateOf; r.CandidateOf != "" {
			r.Shadow = true
		}
		if ok {
			rules = append(rules, r)
		}
		if fr.ID == "" {
			continue
		}
		declared[fr.ID] = true
		// Said once, at the second rule: a third is the same problem.
		if uses[fr.ID]++; uses[fr.ID] == 2 {
			p.addAt(d.lines[fmt.Sprintf("rules[%d]", i)], ruleWhere(fr.ID, -1), "id: %q is used by more than one rule", fr.ID)
		}
	}
	if len(d.Rules) == 0 {
		p.add("rules", "at least one rule is required")
	}
	byID := make(map[string]*Rule, len(rules))
	for i := range rules {
		byID[rules[i].ID] = &rules[i]
	}
	users := usersOf(&p, docUsers, tiers, byID, declared)
	keys, keyOrgs := keysOf(&p, d.APIKeys, tiers)
	warn := d.Warnings.thresholds(&p, "warnings", DefaultThresholds)
	ruleWarn := map[string]Thresholds{}
	for i, fr := range docs {
		if fr.Warning != nil {
			ruleWarn[fr.ID] = fr.Warning.thresholds(&p, fmt.Sprintf("rule %q (rules[%d]): warning", fr.ID, i), warn)
		}
	}
	pol := d.Policies.policies(&p, tiers)
	ex := exemptionsOf(&p, d.Exemptions, declared)
	ents := entitlementsOf(&p, d.Entitlements, declared)
	if err := p.err(); err != nil {
		return nil, err
	}
	s, err := compile(&p, rules, tiers, defaultTier, users)
	if err != nil {
		return nil, err
	}
	s.doc, s.warnings, s.ruleWarnings, s.policies, s.keyTiers, s.keyOrgs = d.WithoutUsers(), warn, ruleWarn, pol, keys, keyOrgs
	s.exempt, s.entitlements = ex, ents
	s.entitlementByID = make(map[string]*Entitlement, len(ents))
	for i := range s.entitlements {
		s.entitlementByID[s.entitlements[i].ID] = &s.entitlements[i]
	}
	return s, nil
}

func (f *Document) tiers(p *problems) (map[string]Tier, string) {
	tiers := make(map[string]Tier, len(f.Tiers)+1)
	for name, t := range f.Tiers {
		if !nameRE.MatchString(name) {
			p.add(fmt.Sprintf("tiers[%q]", name), "name: must match %s", nameRE)
			continue
		}
		tiers[name] = Tier{Name: name, Description: t.Description, Zone: zoneOf(p, fmt.Sprintf("tiers[%q]", name), t.Timezone, t.AnchorDay)}
	}
	def := f.DefaultTier
	switch {
	case len(f.Tiers) == 0 && def == "":
		def = ImplicitTier
		tiers[def] = Tier{Name: def}
	case len(f.Tiers) == 0:
		p.add("default_tier", "%q is not declared under tiers:", def)
	case def == "" && len(tiers) == 1:
		for name := range tiers {
			def = name
		}
	case def == "":
		p.add("default_tier", "required when more than one tier is declared")
	default:
		if _, ok := tiers[def]; !ok {
			p.add("default_tier", "%q is not declared under tiers:", def)
		}
	}
	return tiers, def
}

// keysOf validates the api_keys: section: each key names a declared tier, an org, or both.
func keysOf(p *problems, docKeys map[string]DocKey, tiers map[string]Tier) (keyTiers, keyOrgs map[string]string) {
	keyTiers, keyOrgs = make(map[string]string, len(docKeys)), map[string]string{}
	for key, k := range docKeys {
		where := fmt.Sprintf("api_keys[%q]", key)
		if key == "" || len(key) > MaxIdentifierLen || !utf8.ValidString(key) {
			p.add(where, "key: must be 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
			continue
		}
		if k.Org != "" && validOrg(p, where, k.Org) {
			keyOrgs[key] = k.Org
		}
		switch _, ok := tiers[k.Tier]; {
		case k.Tier == "" && k.Org == "":
			p.add(where, "tier: required (or an org)")
		case k.Tier == "":
		case !ok:
			p.add(where, "tier: %q is not declared under tiers:", k.Tier)
		default:
			keyTiers[key] = k.Tier
		}
	}
	return keyTiers, keyOrgs
}

// validOrg reports whether org is a valid organisation name, reporting it when not: like a
// subject's identifier, 1 to MaxIdentifierLen bytes of valid UTF-8.
func validOrg(p *problems, where, org string) bool {
	if len(org) > MaxIdentifierLen || !utf8.ValidString(org) {
		p.add(where, "org: must be 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
		return false
	}
	return true
}

// usersOf validates the users: section. declared holds the id of every rule of the document:
// a limit naming a rule that has problems of its own is not reported again.
func usersOf(p *problems, docUsers map[string]DocUser, tiers map[string]Tier, byID map[string]*Rule, declared map[string]bool) map[string]User {
	users := make(map[string]User, len(docUsers))
	for id, fu := range docUsers {
		where := fmt.Sprintf("users[%q]", id)
		if id == "" || len(id) > MaxIdentifierLen || !utf8.ValidString(id) {
			p.add(where, "id: must be 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
			continue
		}
		u := User{Tier: fu.Tier, Zone: zoneOf(p, where, fu.Timezone, fu.AnchorDay)}
		if fu.Org != "" && validOrg(p, where, fu.Org) {
			u.Org = fu.Org
		}
		if fu.Tier != "" {
			if _, ok := tiers[fu.Tier]; !ok {
				p.add(where, "tier: %q is not declared under tiers:", fu.Tier)
			}
		}
		for ruleID, s := range fu.Limits {
			r, ok := byID[ruleID]
			switch {
			case !ok && declared[ruleID]:
				continue
			case !ok:
				p.add(where, "limits[%q]: no rule has this id", ruleID)
				continue
			case r.Dimension != DimensionUser:
				p.add(where, "limits[%q]: rule counts per %s; custom limits apply to user rules", ruleID, r.Dimension)
				continue
			}
			n, err := parseCount(string(s))
			if err != nil {
				p.add(where, "limits[%q]: %v", ruleID, err)
				continue
			}
			if u.Limits == nil {
				u.Limits = make(map[string]int64, len(fu.Limits))
			}
			u.Limits[ruleID] = n
		}
		users[id] = u
	}
	return users
}

// rule validates the file's rule fr (at index, for the problems' places) into a Rule, adding
// every problem it finds to p; ok is false when it found any. Each step reads a few of the
// file's fields: what the rule counts by and matches, its count (algorithm, limit, window,
// burst), and how it behaves (shadow, fail mode, prefixes, lease, delay, overage).
func (fr *DocRule) rule(p *problems, index string, tiers map[string]Tier) (r Rule, ok bool) {
	where := index
	if fr.ID != "" {
		where = fmt.Sprintf("rule %q (%s)", fr.ID, index)
	}
	n := len(p.list)
	r = Rule{ID: fr.ID, Endpoint: fr.Endpoint, Tier: fr.Tier, FailMode: FailOpen}
	if !nameRE.MatchString(fr.ID) {
		p.add(where, "id: required, and must match %s", nameRE)
	}
	fr.dimension(p, where, &r)
	descriptorFields(p, where, fr, &r)
	if err := ValidatePattern(fr.Endpoint); err != nil {
		p.add(where, "endpoint: %v", err)
	}
	if fr.Tier != "" {
		if _, ok := tiers[fr.Tier]; !ok {
			p.add(where, "tier: %q is not declared under tiers:", fr.Tier)
		}
	}
	if r.Unlimited {
		return r, len(p.list) == n
	}
	fr.count(p, where, &r)
	fr.behaviour(p, where, &r)
	return r, len(p.list) == n
}

// dimension reads what r counts by: a dimension, or a custom dimension's name (a descriptor of
// its one key), and a descriptor rule's descriptor.
func (fr *DocRule) dimension(p *problems, where string, r *Rule) {
	var err error
	switch {
	case fr.Dimension == "":
		p.add(where, "dimension: required (user, ip, apikey, global, org, descriptor, or a custom dimension's name)")
	case customDimension(fr.Dimension):
		// A custom dimension counts per value of its one key: the descriptor of that key.
		r.Dimension, r.Descriptor = DimensionDescriptor, []Entry{{Key: fr.Dimension}}
		if len(fr.Descriptor) > 0 {
			p.add(where, "descriptor: a custom dimension (%s) is a descriptor of its one key; write dimension: descriptor to match several entries", fr.Dimension)
		}
	default:
		if r.Dimension, err = ParseDimension(fr.Dimension); err != nil {
			p.add(where, "dimension: %v, or a custom dimension's name (matching %s, and no near spelling of those)", err, nameRE)
		} else if r.Dimension == DimensionDescriptor {
			r.Descriptor, r.Shared = descriptorOf(p, where, fr.Descriptor), sharedOf(p, where, fr.Descriptor)
		} else if len(fr.Descriptor) > 0 {
			p.add(where, "descriptor: only descriptor rules (dimension: descriptor) match a descriptor; this rule counts per %s", r.Dimension)
		}
	}
}

// count reads how r counts: its algorithm, limit, window (a duration or a calendar period) and
// burst.
func (fr *DocRule) count(p *problems, where string, r *Rule) {
	var err error
	if fr.Algorithm == "" {
		p.add(where, "algorithm: required")
	} else if r.Algorithm, err = algorithm.Parse(fr.Algorithm); err != nil {
		p.add(where, "algorithm: %v", err)
	}
	switch {
	case fr.Limit == "":
		p.add(where, "limit: required")
	case strings.TrimSpace(string(fr.Limit)) == "0" && r.Algorithm == algorithm.FixedWindow:
		// A fixed window of 0 denies every check (Envoy's "banned" limits).
	default:
		if r.Limit, err = parseCount(string(fr.Limit)); err != nil {
			p.add(where, "limit: %v (0 only for a fixed_window)", err)
		}
	}
	if fr.Window == "" {
		p.add(where, "window: required (a Go duration: 1s, 1m, 1h, 24h; or a calendar period: 1d, 1w, 1mo, 1y)")
	} else if u, ok := calendar.ParseUnit(strings.TrimSpace(string(fr.Window))); ok {
		r.Window, r.Calendar.Unit = u.Nominal(), u
	} else if r.Window, err = parseWindow(string(fr.Window)); err != nil {
		p.add(where, "window: %v", err)
	}
	r.Calendar = ruleCalendar(p, where, fr, r)
	if r.Limit == 0 && r.Calendar.Unit.Valid() && fr.Limit != "" {
		// A ban is a fixed window's count that never allows; a calendar period's bucket
		// counts from 1 (lua/calendar_window.lua).
		p.add(where, "limit: 0 (a ban) needs a fixed_window of a fixed length (24h, not 1d); got a calendar window of %s", r.Calendar.Unit)
	}
	if r.Algorithm == algorithm.Concurrency && r.Window > MaxHoldTTL {
		p.add(where, "window: a concurrency rule's window is how long a place is held unless released, at most %s; got %s", MaxHoldTTL, r.Window)
	}
	r.Burst = r.Limit
	if fr.Burst != "" {
		switch b, err := parseCount(string(fr.Burst)); {
		case err != nil:
			p.add(where, "burst: %v", err)
		case r.Algorithm.Valid() && !r.Algorithm.HasBurst():
			p.add(where, "burst: %s counts up to its limit and takes no burst (token_bucket, leaky_bucket and gcra do)", r.Algorithm)
		default:
			r.Burst = b
		}
	}
}

// behaviour reads how r behaves besides counting: shadow, fail mode, an ip rule's networks, a
// lease, a delay, an overage bound, and counting denied hits.
func (fr *DocRule) behaviour(p *problems, where string, r *Rule) {
	var err error
	if fr.Shadow != "" {
		if r.Shadow, err = strconv.ParseBool(string(fr.Shadow)); err != nil {
			p.add(where, "shadow: want true or false, got %q", fr.Shadow)
		}
	}
	if fr.FailMode != "" {
		if r.FailMode, err = ParseFailMode(fr.FailMode); err != nil {
			p.add(where, "fail_mode: %v", err)
		} else if r.FailMode == FailLocal && r.Algorithm == algorithm.Concurrency {
			// A checker's own buckets never learn of releases, which go to Redis.
			p.add(where, "fail_mode: local cannot count requests in flight (releases go to Redis); want open or closed")
		}
	}
	r.IPv6Prefix = prefixBits(p, where, "ipv6_prefix", fr.IPv6Prefix, 128, r.Dimension)
	r.IPv4Prefix = prefixBits(p, where, "ipv4_prefix", fr.IPv4Prefix, 32, r.Dimension)
	if fr.Lease != nil {
		r.Allotment = allotmentOf(p, where, fr.Lease, r)
	}
	r.MaxDelay = onLimit(p, where, fr, r)
	if fr.MaxOverage != "" {
		switch n, err := parseCount(string(fr.MaxOverage)); {
		case err != nil:
			p.add(where, "max_overage: %v", err)
		case r.Algorithm == algorithm.Concurrency:
			p.add(where, "max_overage: a concurrency rule holds places, which a settle does not charge")
		default:
			r.MaxOverage = n
		}
	}
	r.Shadow = r.Shadow || r.QuotaMode // a rule in quota mode never denies
	if r.CountDenied && (r.Algorithm != algorithm.FixedWindow || r.Calendar.Unit.Valid()) {
		p.add(where, "count_denied: only a fixed_window of a fixed length counts the hits over its limit; got %s of %s", r.Algorithm, r.WindowName())
	}
}

// onLimit validates a rule's on_limit and max_delay and returns its MaxDelay: a queue (delay
// instead of deny) needs a rate algorithm, whose checks it can space exactly (gcra, and
// leaky_bucket, the same meter), and a longest delay of 1ms to the window: a queue longer than
// the window would hold more than a window's worth of checks waiting.
func onLimit(p *problems, where string, fr *DocRule, r *Rule) time.Duration {
	switch fr.OnLimit {
	case "", "deny":
		if fr.MaxDelay != "" {
			p.add(where, "max_delay: only a rule with on_limit: delay waits; this one denies")
		}
		return 0
	case "delay":
	default:
		p.add(where, "on_limit: want deny or delay, got %q", fr.OnLimit)
		return 0
	}
	if r.Algorithm.Valid() && r.Algorithm != algorithm.GCRA && r.Algorithm != algorithm.LeakyBucket {
		p.add(where, "on_limit: delay spaces checks with a leaky bucket used as a queue: algorithm gcra or leaky_bucket, not %s", r.Algorithm)
	}
	if fr.MaxDelay == "" {
		p.add(where, "max_delay: required with on_limit: delay (a Go duration: 100ms, 1s), at most the window")
		return 0
	}
	d, err := time.ParseDuration(strings.TrimSpace(string(fr.MaxDelay)))
	switch {
	case err != nil:
		p.add(where, "max_delay: want a Go duration such as 250ms or 1s, got %q", fr.MaxDelay)
		return 0
	case d < time.Millisecond || d%time.Millisecond != 0:
		p.add(where, "max_delay: want a whole number of milliseconds, at least 1ms, got %q", fr.MaxDelay)
		return 0
	case r.Window > 0 && d > r.Window:
		p.add(where, "max_delay: %s is above the rule's window (%s); a queue holds at most a window", d, r.Window)
		return 0
	}
	return d
}

// descriptorFields validates a rule's name, replaces, unlimited and count_denied, which only
// descriptor rules take.
func descriptorFields(p *problems, where string, fr *DocRule, r *Rule) {
	var err error
	if r.Dimension == DimensionDescriptor {
		r.MaxValues = DefaultMaxValues
	}
	if fr.MaxValues != "" {
		switch n, cerr := parseCount(string(fr.MaxValues)); {
		case cerr != nil:
			p.add(where, "max_values: %v", cerr)
		case r.Dimension != DimensionDescriptor:
			p.add(where, "max_values: only descriptor rules take one (dimension: descriptor or a custom dimension)")
		default:
			r.MaxValues = n
		}
	}
	if fr.Unlimited != "" {
		if r.Unlimited, err = strconv.ParseBool(string(fr.Unlimited)); err != nil {
			p.add(where, "unlimited: want true or false, got %q", fr.Unlimited)
		}
	}
	if fr.CountDenied != "" {
		if r.CountDenied, err = strconv.ParseBool(string(fr.CountDenied)); err != nil {
			p.add(where, "count_denied: want true or false, got %q", fr.CountDenied)
		}
	}
	if fr.QuotaMode != "" {
		if r.QuotaMode, err = strconv.ParseBool(string(fr.QuotaMode)); err != nil {
			p.add(where, "quota_mode: want true or false, got %q", fr.QuotaMode)
		}
	}
	r.Name, r.Replaces = fr.Name, fr.Replaces
	if r.Dimension != DimensionDescriptor {
		for _, f := range []struct {
			name string
			set  bool
		}{{"name", fr.Name != ""}, {"replaces", len(fr.Replaces) > 0}, {"unlimited", r.Unlimited}, {"quota_mode", r.QuotaMode}} {
			if f.set {
				p.add(where, "%s: only descriptor rules take one (dimension: descriptor or a custom dimension)", f.name)
			}
		}
	}
	if len(fr.Name) > MaxIdentifierLen {
		p.add(where, "name: at most %d bytes", MaxIdentifierLen)
	}
	for i, name := range fr.Replaces {
		switch {
		case name == "":
			p.add(where, "replaces[%d]: empty: name the rule (its name:) this one replaces", i)
		case name == fr.Name:
			p.add(where, "replaces[%d]: %q is this rule's own name", i, name)
		}
	}
	if !r.Unlimited {
		return
	}
	// An unlimited rule limits nothing: it has no bucket to describe.
	for _, f := range []struct {
		name string
		set  bool
	}{{"algorithm", fr.Algorithm != ""}, {"limit", fr.Limit != ""}, {"window", fr.Window != ""}, {"burst", fr.Burst != ""}, {"count_denied", r.CountDenied}, {"lease", fr.Lease != nil}} {
		if f.set {
			p.add(where, "%s: an unlimited rule has none", f.name)
		}
	}
}

// ruleCalendar validates a rule's time zone and anchor day, which only calendar windows take,
// and a calendar window's algorithm: a fixed window, the one whose count a period bounds (a
// token bucket refills at limit per window, which a month of varying length does not define).
func ruleCalendar(p *problems, where string, fr *DocRule, r *Rule) calendar.Period {
	c := r.Calendar
	if !c.Unit.Valid() {
		if fr.Timezone != "" {
			p.add(where, "timezone: only calendar windows (1d, 1w, 1mo, 1y) have one; window is %q", fr.Window)
		}
		if fr.AnchorDay != "" {
			p.add(where, "anchor_day: only monthly windows (1mo) have one; window is %q", fr.Window)
		}
		return c
	}
	if r.Algorithm.Valid() && r.Algorithm != algorithm.FixedWindow {
		p.add(where, "window: %s is a calendar window, which only fixed_window counts; algorithm is %s", c.Unit, r.Algorithm)
	}
	z := zoneOf(p, where, fr.Timezone, fr.AnchorDay)
	if fr.AnchorDay != "" && c.Unit != calendar.Month {
		p.add(where, "anchor_day: only monthly windows (1mo) have one; window is %s", c.Unit)
	}
	c.Location, c.AnchorDay = z.Location, z.AnchorDay
	if c.Location == nil {
		c.Location = time.UTC
	}
	return c
}

// zoneOf validates a time zone (an IANA name) and an anchor day (1 to 31), either empty.
func zoneOf(p *problems, where, tz string, anchor Scalar) Zone {
	var z Zone
	if tz != "" {
		loc, err := time.LoadLocation(tz)
		if err != nil || tz == "Local" {
			p.add(where, "timezone: unknown time zone %q (want an IANA name such as Europe/Berlin, or UTC)", tz)
		} else {
			z.Location = loc
		}
	}
	if anchor != "" {
		n, err := strconv.Atoi(strings.TrimSpace(string(anchor)))
		if err != nil || n < 1 || n > calendar.MaxAnchorDay {
			p.add(where, "anchor_day: want a day of the month from 1 to %d, got %q", calendar.MaxAnchorDay, anchor)
		} else {
			z.AnchorDay = n
		}
	}
	return z
}

// allotmentOf validates a rule's lease: a slice of 1 to the limit, on a global fixed_window
// rule only. A lease is a share of one window's count taken ahead of the checks it pays for:
// only a window algorithm can be split that way exactly (a token bucket's or GCRA's budget
// refills continuously, and a slice taken now would be spent at a later, fuller, instant),
// and only a key every check shares is hot enough to be worth a slice per checker.
func allotmentOf(p *problems, where string, l *DocLease, r *Rule) int64 {
	n := len(p.list)
	if r.Dimension.Valid() && r.Dimension != DimensionGlobal {
		p.add(where, "lease: only global rules are leased (one bucket every check shares); this rule counts per %s", r.Dimension)
	}
	if r.Algorithm.Valid() && r.Algorithm != algorithm.FixedWindow {
		p.add(where, "lease: only fixed_window rules are leased (a slice is a share of one window's count); this rule is %s", r.Algorithm)
	}
	if r.Calendar.Unit.Valid() {
		p.add(where, "lease: calendar windows (%s) are not leased", r.Calendar.Unit)
	}
	slice, err := parseCount(string(l.Slice))
	switch {
	case l.Slice == "":
		p.add(where, "lease: slice: required (the units a checker takes at a time)")
	case err != nil:
		p.add(where, "lease: slice: %v", err)
	case r.Limit > 0 && slice > r.Limit:
		p.add(where, "lease: slice: %d is more than the limit (%d)", slice, r.Limit)
	}
	if len(p.list) != n {
		return 0
	}
	return slice
}

// ValidatePattern checks a rule's endpoint pattern: "*", an exact path, or a path prefix ending
// in "/*", the path in the normal form endpoints are matched in (urlpath.Normalize).
func ValidatePattern(pattern string) error {
	switch {
	case pattern == "":
		return errors.New(`required: an exact path ("/api/v1/orders"), a prefix ending in "/*" ("/api/*") or "*"`)
	case pattern == "*":
		return nil
	case len(pattern) > MaxEndpointLen:
		return fmt.Errorf("longer than %d bytes", MaxEndpointLen)
	case !utf8.ValidString(pattern):
		return errors.New("not valid UTF-8")
	case pattern[0] != '/':
		return fmt.Errorf(`%q must start with "/" (or be "*")`, pattern)
	case strings.ContainsAny(pattern, " \t\r\n?#"):
		return fmt.Errorf("%q holds white space, '?' or '#'", pattern)
	}
	if i := strings.IndexByte(pattern, '*'); i >= 0 && (i != len(pattern)-1 || pattern[i-1] != '/') {
		return fmt.Errorf(`%q: "*" may only end the pattern, as "/*"`, pattern)
	}
	// Endpoints are matched in normal form (internal/urlpath): a pattern in any other form
	// would never match, so it is refused with the form to write.
	base, prefix := strings.CutSuffix(pattern, "/*")
	if prefix && base == "" {
		return nil // "/*": every path
	}
	norm, err := urlpath.Normalize(base)
	if err != nil {
		return fmt.Errorf("%q %v", pattern, err)
	}
	if norm != base {
		if prefix {
			norm = strings.TrimSuffix(norm, "/") + "/*"
		}
		return fmt.Errorf(`%q would never match: endpoints are matched in normal form (lower case, escapes of letters, digits and "-._~" decoded, no ";" parameters, no ".", ".." or empty segment, no trailing "/"); write %q`, pattern, norm)
	}
	return nil
}

// prefixBits validates an ip rule's ipv6_prefix or ipv4_prefix: 1 to max bits; 0 when unset.
func prefixBits(p *problems, where, field string, v Scalar, max int, dim Dimension) uint8 {
	if v == "" {
		return 0
	}
	if dim != DimensionIP {
		p.add(where, "%s: groups the addresses of ip rules; this rule counts per %s", field, dim)
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(v)))
	if err != nil || n < 1 || n > max {
		p.add(where, "%s: want a number of leading bits from 1 to %d, got %q", field, max, v)
		return 0
	}
	return uint8(n)
}

func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 1 || n > MaxLimit {
		return 0, fmt.Errorf("want a whole number from 1 to %d, got %q", MaxLimit, s)
	}
	return n, nil
}

func parseWindow(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	switch {
	case err != nil:
		return 0, fmt.Errorf("want a Go duration such as 1s, 1m, 1h or 24h, or a calendar period (1d, 1w, 1mo, 1y), got %q", s)
	case d < MinWindow || d > MaxWindow:
		return 0, fmt.Errorf("%q is outside %s to %s", s, MinWindow, MaxWindow)
	case d%time.Millisecond != 0:
		return 0, fmt.Errorf("%q is not a whole number of milliseconds", s)
	}
	return d, nil
}

func ruleWhere(id string, i int) string {
	if i < 0 {
		return fmt.Sprintf("rule %q", id)
	}
	return fmt.Sprintf("rule %q (rules[%d])", id, i)
}
