package rules

import (
	"fmt"
	"net/netip"
	"slices"
)

// An exemption lets the checks of a trusted subject past chosen rules, or past every rule: an
// office network's addresses, an internal service's user or API key, a tenant (a custom
// dimension's value). A check naming an exempt subject is still decided, counted by the rules it
// is not exempt from, and recorded on the decision stream with the exemption's id, so that the
// usage of exempt callers stays visible. Exemptions are part of the rules document: written in
// the rules file under exemptions:, or through the admin API, which records every change as a
// config event like any other.

// Exemption is one validated exemption.
type Exemption struct {
	ID string
	// Dimension and Value name the subject: a user or API key by its identifier, the checks
	// whose IP address is in Prefix, or a custom dimension (Dimension DimensionDescriptor,
	// Key its name) by its value.
	Dimension Dimension
	Key       string
	Value     string
	Prefix    netip.Prefix
	// Rules are the ids of the rules the subject's checks are exempt from; empty means all.
	Rules  []string
	Reason string

	order int // the place in the document: of several that match a check, the first applies
}

// Exempts reports whether e exempts checks from rule id.
func (e *Exemption) Exempts(id string) bool { return len(e.Rules) == 0 || slices.Contains(e.Rules, id) }

// DocExemption is an exemption in a Document: exactly one subject (user, apikey, ip, or a custom
// dimension and its value), the rules it is exempt from (none: all), and why.
type DocExemption struct {
	ID        string   `yaml:"id" json:"id"`
	Dimension string   `yaml:"dimension" json:"dimension"`
	Value     string   `yaml:"value" json:"value"`
	Rules     []string `yaml:"rules,omitempty" json:"rules,omitempty"`
	Reason    string   `yaml:"reason,omitempty" json:"reason,omitempty"`
}

// exemptions is a set's exemptions, indexed for a check's subjects.
type exemptions struct {
	list   []Exemption
	byID   map[exemptKey]*Exemption // user, apikey and custom ones
	ranges []*Exemption             // ip ones, in document order
}

type exemptKey struct {
	dim        Dimension
	key, value string
}

// exemptionsOf validates a document's exemptions against its rules.
func exemptionsOf(p *problems, docs []DocExemption, ruleIDs map[string]bool) *exemptions {
	if len(docs) == 0 {
		return nil
	}
	ex := &exemptions{list: make([]Exemption, 0, len(docs)), byID: map[exemptKey]*Exemption{}}
	seen := map[string]bool{}
	for i, d := range docs {
		if e, ok := exemptionOf(p, fmt.Sprintf("exemptions[%d]", i), d, ruleIDs); ok {
			if seen[e.ID] {
				p.add(fmt.Sprintf("exemptions[%d]", i), "id: %q is used by more than one exemption", e.ID)
				continue
			}
			seen[e.ID] = true
			ex.list = append(ex.list, e)
		}
	}
	for i := range ex.list {
		e := &ex.list[i]
		e.order = i
		if e.Dimension == DimensionIP {
			ex.ranges = append(ex.ranges, e)
			continue
		}
		k := exemptKey{e.Dimension, e.Key, e.Value}
		if ex.byID[k] == nil { // the first of a subject's exemptions decides
			ex.byID[k] = e
		}
	}
	return ex
}

func exemptionOf(p *problems, where string, d DocExemption, ruleIDs map[string]bool) (Exemption, bool) {
	n := len(p.list)
	e := Exemption{ID: d.ID, Value: d.Value, Rules: d.Rules, Reason: d.Reason}
	if !nameRE.MatchString(d.ID) {
		p.add(where, "id: required, and must match %s", nameRE)
	}
	switch {
	case d.Dimension == "":
		p.add(where, "dimension: required (user, apikey, ip, or a custom dimension's name)")
	case customDimension(d.Dimension):
		e.Dimension, e.Key = DimensionDescriptor, d.Dimension
	default:
		dim, err := ParseDimension(d.Dimension)
		switch {
		case err != nil:
			p.add(where, "dimension: %v", err)
		case dim != DimensionUser && dim != DimensionAPIKey && dim != DimensionIP:
			p.add(where, "dimension: %s subjects cannot be exempt (want user, apikey, ip, or a custom dimension)", dim)
		}
		e.Dimension = dim
	}
	switch {
	case d.Value == "" || len(d.Value) > MaxIdentifierLen:
		p.add(where, "value: required, 1 to %d bytes", MaxIdentifierLen)
	case e.Dimension == DimensionIP:
		pfx, err := netip.ParsePrefix(d.Value)
		if err != nil {
			a, aerr := netip.ParseAddr(d.Value)
			if aerr != nil {
				p.add(where, "value: %q is neither an address nor a CIDR (10.0.0.0/8, 2001:db8::/32)", d.Value)
				break
			}
			pfx = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		bits := pfx.Bits()
		if pfx.Addr().Is4In6() { // ::ffff:10.0.0.0/104 is 10.0.0.0/8, as checks' addresses are unmapped
			bits -= 96
		}
		if e.Prefix = netip.PrefixFrom(pfx.Addr().Unmap(), bits).Masked(); !e.Prefix.IsValid() {
			p.add(where, "value: %q is no network of IPv4 addresses", d.Value)
		}
	}
	for j, id := range d.Rules {
		if !ruleIDs[id] {
			p.add(where, "rules[%d]: no rule has id %q", j, id)
		}
	}
	if len(d.Reason) > 1024 {
		p.add(where, "reason: at most 1024 bytes")
	}
	return e, len(p.list) == n
}

// Exemption returns the exemption of a check whose subjects are these (the first, in the
// document's order, of a user's, an API key's, a custom dimension's and the IP's), nil for
// none. ip is the check's address, invalid when it has none; entries its custom dimensions.
func (s *Set) Exemption(user, apiKey string, ip netip.Addr, entries []Entry) *Exemption {
	ex := s.exempt
	if ex == nil {
		return nil
	}
	var best *Exemption
	pick := func(e *Exemption) {
		if e != nil && (best == nil || e.order < best.order) {
			best = e
		}
	}
	if user != "" {
		pick(ex.byID[exemptKey{DimensionUser, "", user}])
	}
	if apiKey != "" {
		pick(ex.byID[exemptKey{DimensionAPIKey, "", apiKey}])
	}
	for _, en := range entries {
		pick(ex.byID[exemptKey{DimensionDescriptor, en.Key, en.Value}])
	}
	if ip.IsValid() {
		for _, e := range ex.ranges {
			if e.Prefix.Contains(ip) {
				pick(e)
				break
			}
		}
	}
	return best
}

// Exemptions returns the set's exemptions in document order. Do not modify them.
func (s *Set) Exemptions() []Exemption {
	if s.exempt == nil {
		return nil
	}
	return s.exempt.list
}

// HasExemptions reports whether any exemption is declared: only then do checks look theirs up.
func (s *Set) HasExemptions() bool { return s.exempt != nil }
