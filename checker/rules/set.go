package rules

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Set is a compiled, immutable rule set. It is safe for concurrent use; a new file makes a new
// Set, swapped in atomically by its user.
type Set struct {
	rules       []Rule
	byID        map[string]*Rule
	tiers       map[string]Tier
	defaultTier string
	users       map[string]User
	keyTiers    map[string]string // API key → tier
	keyOrgs     map[string]string // API key → org
	matchers    map[matcherKey]*matcher

	doc          *Document // the source document, without users
	warnings     Thresholds
	ruleWarnings map[string]Thresholds
	policies     Policies
	ovr          *overrideIndex  // nil: no overrides
	calendar     bool            // a rule has a calendar window
	orgRules     bool            // a rule counts per org
	domains      map[string]bool // the endpoints descriptor rules name exactly
	exempt       *exemptions     // nil: none
	entitlements []Entitlement
	// entitlementByID indexes entitlements: Thresholds asks it for every limit of every check.
	entitlementByID map[string]*Entitlement
}

// HasCalendar reports whether a rule of the set has a calendar window: its checks need the
// time, to find their periods.
func (s *Set) HasCalendar() bool { return s.calendar }

type matcherKey struct {
	dim  Dimension
	tier string
}

// compile builds one endpoint matcher per dimension and tier, so that a check does one map
// lookup and one walk down a prefix tree.
// compile builds the matchers of valid rules; p, empty, names the problems of rules that
// conflict.
func compile(p *problems, rules []Rule, tiers map[string]Tier, defaultTier string, users map[string]User) (*Set, error) {
	s := &Set{
		rules:       rules,
		byID:        make(map[string]*Rule, len(rules)),
		tiers:       tiers,
		defaultTier: defaultTier,
		users:       users,
		matchers:    make(map[matcherKey]*matcher),
	}
	for i := range s.rules {
		s.byID[s.rules[i].ID] = &s.rules[i]
		s.calendar = s.calendar || s.rules[i].Calendar.Unit.Valid()
		s.orgRules = s.orgRules || s.rules[i].Dimension == DimensionOrg
		if r := &s.rules[i]; r.Dimension == DimensionDescriptor && r.Endpoint != "*" && !strings.HasSuffix(r.Endpoint, "/*") {
			if s.domains == nil {
				s.domains = make(map[string]bool)
			}
			s.domains[r.Endpoint] = true
		}
	}
	for i := range s.rules {
		if c := &s.rules[i]; c.CandidateOf != "" {
			live := s.byID[c.CandidateOf]
			live.Candidates = append(live.Candidates, c)
		}
	}
	dups := sharedBuckets{}
	for dim := DimensionUser; dim <= lastDimension; dim++ {
		for tier := range tiers {
			m := newMatcher()
			for i := range s.rules {
				// A candidate is planned from its live rule (Rule.Candidates), never matched.
				if r := &s.rules[i]; r.Dimension == dim && (r.Tier == "" || r.Tier == tier) && r.CandidateOf == "" {
					m.add(r)
				}
			}
			m.finish(dups, tier)
			if dim == DimensionDescriptor {
				m.plant()
			}
			if !m.empty() {
				s.matchers[matcherKey{dim, tier}] = m
			}
		}
	}
	dups.report(p)
	if err := p.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// Match returns the rules of dimension dim that apply to endpoint for tier: the rules of the
// most specific pattern (exact path, then the longest "/*" prefix, then "*"); at one pattern,
// rules naming the tier replace rules naming none. Patterns are in normal form
// (urlpath.Normalize): endpoint must be too, or spellings of one path match differently. The
// slice is shared: do not modify it.
func (s *Set) Match(dim Dimension, tier, endpoint string) []*Rule {
	m := s.matchers[matcherKey{dim, tier}]
	if m == nil {
		return nil
	}
	return m.match(endpoint)
}

// Rules returns every rule, in file order. The slice is shared: do not modify it.
func (s *Set) Rules() []Rule { return s.rules }

// Rule returns the rule with the given id.
func (s *Set) Rule(id string) (*Rule, bool) {
	r, ok := s.byID[id]
	return r, ok
}

// DefaultTier is the tier of callers with no tier of their own.
func (s *Set) DefaultTier() string { return s.defaultTier }

// HasTier reports whether name is a declared tier.
func (s *Set) HasTier(name string) bool {
	_, ok := s.tiers[name]
	return ok
}

// Tiers returns the declared tiers sorted by name.
func (s *Set) Tiers() []Tier {
	out := make([]Tier, 0, len(s.tiers))
	for _, t := range s.tiers {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// User returns the configured tier and custom limits of a user.
func (s *Set) User(id string) (User, bool) {
	u, ok := s.users[id]
	return u, ok
}

// TierOf returns the tier of a user: its configured tier, else the default tier.
func (s *Set) TierOf(userID string) string {
	if u, ok := s.users[userID]; ok && u.Tier != "" {
		return u.Tier
	}
	return s.defaultTier
}

// SubjectTier returns the tier of a check's subjects from the configuration alone, never from
// the request: the user's configured tier, else the API key's, else the default tier. Either
// may be empty (no such subject).
func (s *Set) SubjectTier(userID, apiKey string) string {
	if u, ok := s.users[userID]; ok && u.Tier != "" && userID != "" {
		return u.Tier
	}
	if t, ok := s.keyTiers[apiKey]; ok && apiKey != "" {
		return t
	}
	return s.defaultTier
}

// OrgOf returns the organisation of a check's subjects: its user's, else its API key's; empty
// when neither belongs to one.
func (s *Set) OrgOf(userID, apiKey string) string {
	if u, ok := s.users[userID]; ok && u.Org != "" && userID != "" {
		return u.Org
	}
	if o, ok := s.keyOrgs[apiKey]; ok && apiKey != "" {
		return o
	}
	return ""
}

// HasOrgRules reports whether a rule counts per org: only then do checks look their org up.
func (s *Set) HasOrgRules() bool { return s.orgRules }

// Document returns the document the set was compiled from, without its users. Do not modify it.
func (s *Set) Document() *Document { return s.doc }

// Users returns every configured user. Do not modify the map.
func (s *Set) Users() map[string]User { return s.users }

// Thresholds returns the warning thresholds of the rule with the given id: its own, else the
// document's, else DefaultThresholds.
func (s *Set) Thresholds(ruleID string) Thresholds {
	if t, ok := s.ruleWarnings[ruleID]; ok {
		return t
	}
	if e, ok := s.Entitlement(ruleID); ok {
		return e.Warning()
	}
	if s.warnings == (Thresholds{}) {
		return DefaultThresholds
	}
	return s.warnings
}

// Policies returns the aggregator's automatic override policies.
func (s *Set) Policies() Policies { return s.policies }

// matcher finds the rules of one dimension and tier for an endpoint.
type matcher struct {
	exact map[string][]*Rule
	root  *node // prefix rules, one tree level per path segment
	all   []*Rule
	// trees are the descriptor trees of a descriptor matcher's rule lists, by their first
	// rule (plant).
	trees map[*Rule]*descNode
}

type node struct {
	children map[string]*node
	rules    []*Rule
}

func newMatcher() *matcher {
	return &matcher{exact: make(map[string][]*Rule), root: &node{}}
}

func (m *matcher) add(r *Rule) {
	switch p := r.Endpoint; {
	case p == "*":
		m.all = append(m.all, r)
	case strings.HasSuffix(p, "/*"):
		n := m.root
		for seg := range segments(p[:len(p)-2]) {
			child := n.children[seg]
			if child == nil {
				if n.children == nil {
					n.children = make(map[string]*node)
				}
				child = &node{}
				n.children[seg] = child
			}
			n = child
		}
		n.rules = append(n.rules, r)
	default:
		m.exact[p] = append(m.exact[p], r)
	}
}

// plant builds the descriptor tree of every rule list of m.
func (m *matcher) plant() {
	m.trees = make(map[*Rule]*descNode)
	add := func(rs []*Rule) {
		if len(rs) > 0 {
			m.trees[rs[0]] = descTree(rs)
		}
	}
	add(m.all)
	for _, rs := range m.exact {
		add(rs)
	}
	var walk func(n *node)
	walk = func(n *node) {
		add(n.rules)
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(m.root)
}

func (m *matcher) empty() bool {
	return len(m.exact) == 0 && len(m.all) == 0 && m.root.rules == nil && m.root.children == nil
}

// finish keeps, at each pattern, the rules naming the tier when there are any, and reports two
// rules that would share one bucket.
// sharedBuckets are the pairs of rules that would share one bucket (rule, rule it duplicates)
// with the tiers where they would: one problem each, however many tiers it spans.
type sharedBuckets map[[2]string][]string

func (d sharedBuckets) report(p *problems) {
	for pair, tiers := range d {
		slices.Sort(tiers)
		quoted := make([]string, len(tiers))
		for i, t := range tiers {
			quoted[i] = strconv.Quote(t)
		}
		which := "tier " + quoted[0]
		if len(quoted) > 1 {
			which = "tiers " + strings.Join(quoted[:len(quoted)-1], ", ") + " and " + quoted[len(quoted)-1]
		}
		p.add(ruleWhere(pair[0], -1), "duplicates rule %q for %s: same dimension, endpoint, algorithm, window (and network prefix) would share one bucket", pair[1], which)
	}
}

func (m *matcher) finish(p sharedBuckets, tier string) {
	m.all = preferTier(p, tier, m.all)
	for k, rs := range m.exact {
		m.exact[k] = preferTier(p, tier, rs)
	}
	var walk func(n *node)
	walk = func(n *node) {
		n.rules = preferTier(p, tier, n.rules)
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(m.root)
}

func preferTier(p sharedBuckets, tier string, rs []*Rule) []*Rule {
	if len(rs) == 0 {
		return nil
	}
	var tiered []*Rule
	for _, r := range rs {
		if r.Tier != "" {
			tiered = append(tiered, r)
		}
	}
	if tiered != nil {
		rs = tiered
	}
	seen := make(map[string]*Rule, len(rs))
	for _, r := range rs {
		k := fmt.Sprintf("%s/%s", r.Algorithm, r.WindowName())
		if r.Dimension == DimensionDescriptor {
			// A descriptor rule's bucket is its descriptor's: rules of other patterns never
			// meet in one.
			k += "/" + descriptorPattern(r.Descriptor)
		}
		keys := []string{k}
		if r.Dimension == DimensionIP {
			// ip rules share a bucket only where they group an address family alike.
			keys = []string{fmt.Sprintf("%s/v4/%d", k, r.PrefixBits(true)), fmt.Sprintf("%s/v6/%d", k, r.PrefixBits(false))}
		}
		for _, k := range keys {
			if other := seen[k]; other != nil {
				pair := [2]string{r.ID, other.ID}
				p[pair] = append(p[pair], tier)
				break
			}
		}
		for _, k := range keys {
			seen[k] = r
		}
	}
	return rs
}

func (m *matcher) match(endpoint string) []*Rule {
	if rs, ok := m.exact[endpoint]; ok {
		return rs
	}
	best := m.root.rules
	n := m.root
	for seg := range segments(endpoint) {
		n = n.children[seg]
		if n == nil {
			break
		}
		if n.rules != nil {
			best = n.rules
		}
	}
	if best != nil {
		return best
	}
	return m.all
}

// segments yields the non-empty segments of a path without allocating.
func segments(path string) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		for path != "" {
			i := strings.IndexByte(path, '/')
			var seg string
			if i < 0 {
				seg, path = path, ""
			} else {
				seg, path = path[:i], path[i+1:]
			}
			if seg != "" && !yield(seg) {
				return
			}
		}
	}
}
