package rules

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/quotaflow/quotaflow/internal/suggest"
)

// A descriptor is what Envoy's rate limit service counts by: an ordered list of entries, each a
// key and a value ("source_cluster" "proxy", then "destination_cluster" "mock"). quotaflow's
// custom dimensions are descriptors too: a check names its tenant as the entry ("tenant",
// "acme"). A rule of DimensionDescriptor matches a check's descriptor as the reference service
// matches its configuration's tree (descTree): entry by entry from the root, each entry by its
// exact value, else by a value prefix ("foo*"), else by its key alone (any value), and only
// when the descriptor ends where the rule does. Every value of the descriptor names the
// bucket, as in the reference's cache keys: a rule whose entry has no value counts one bucket
// per value.

// Entry is one entry of a descriptor, or of a rule's descriptor pattern: there, an empty
// Value matches any value, and one ending in "*" every value it prefixes.
type Entry struct {
	Key   string
	Value string
}

// MaxDescriptorEntries bounds a descriptor, in a check and in a rule.
const MaxDescriptorEntries = 16

// descNode is a level of the tree of one endpoint pattern's descriptor rules.
type descNode struct {
	children  map[Entry]*descNode // by exact entry; a key-only pattern has Value ""
	wildcards []Entry             // children whose value ends in "*", in rule order
	rule      *Rule
	// shared is a wildcard node whose values share one bucket (Rule.Shared): a descriptor
	// reaching a rule through it is counted under the pattern, not its own value.
	shared bool
}

// descTree builds the tree of rules rs (all of DimensionDescriptor). Two rules of one pattern
// are reported by compile's duplicate check (one bucket), so the first is kept here.
func descTree(rs []*Rule) *descNode {
	root := &descNode{}
	for _, r := range rs {
		n := root
		for i, e := range r.Descriptor {
			child := n.children[e]
			if child == nil {
				if n.children == nil {
					n.children = make(map[Entry]*descNode)
				}
				child = &descNode{}
				n.children[e] = child
				if strings.HasSuffix(e.Value, "*") {
					n.wildcards = append(n.wildcards, e)
				}
			}
			child.shared = child.shared || i < len(r.Shared) && r.Shared[i]
			n = child
		}
		if n.rule == nil {
			n.rule = r
		}
	}
	return root
}

// match walks the tree as the reference service walks its configuration (GetLimit): the rule
// at the node the last entry reaches, nil when an entry finds no node before that; and the
// entries that name its bucket: entries itself, or, when the walk went through shared
// wildcard nodes, a copy with their patterns in place of those entries' values.
func (root *descNode) match(entries []Entry) (*Rule, []Entry) {
	n := root
	bucket := entries
	for i, e := range entries {
		next := n.children[e]
		if next == nil {
			for _, w := range n.wildcards {
				if w.Key == e.Key && strings.HasPrefix(e.Value, w.Value[:len(w.Value)-1]) {
					if next = n.children[w]; next.shared {
						if &bucket[0] == &entries[0] {
							bucket = slices.Clone(entries)
						}
						bucket[i].Value = w.Value
					}
					break
				}
			}
		}
		if next == nil {
			next = n.children[Entry{Key: e.Key}]
		}
		if next == nil {
			return nil, nil
		}
		if i == len(entries)-1 {
			if next.rule == nil {
				return nil, nil
			}
			return next.rule, bucket
		}
		n = next
	}
	return nil, nil
}

// MatchDescriptor returns the descriptor rule that applies to entries at endpoint for tier (nil
// for none): among the rules of the most specific endpoint pattern (Match), the one the
// descriptor reaches; and the entries that name its bucket (entries, but for the values of
// entries matched by a shared wildcard, which are the wildcard: Rule.Shared).
func (s *Set) MatchDescriptor(tier, endpoint string, entries []Entry) (*Rule, []Entry) {
	m := s.matchers[matcherKey{DimensionDescriptor, tier}]
	if m == nil || len(entries) == 0 {
		return nil, nil
	}
	rs := m.match(endpoint)
	if len(rs) == 0 {
		return nil, nil
	}
	return m.trees[rs[0]].match(entries)
}

// MatchesDescriptor reports whether descriptor rule r matches entries, as it would alone in its
// tree (MatchDescriptor picks one rule among several).
func (r *Rule) MatchesDescriptor(entries []Entry) bool {
	got, _ := descTree([]*Rule{r}).match(entries)
	return r.Dimension == DimensionDescriptor && got == r
}

// DescriptorDomain reports whether a descriptor rule names endpoint exactly: Envoy's domain
// whose configuration was imported ("/" + domain), whose descriptors are then matched whole,
// every entry an entry, as the reference service matches them.
func (s *Set) DescriptorDomain(endpoint string) bool { return s.domains[endpoint] }

// descriptorPattern is a rule's descriptor as one string, for the duplicate check.
func descriptorPattern(es []Entry) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString(strconv.Quote(e.Key))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(e.Value))
		b.WriteByte(';')
	}
	return b.String()
}

// DocEntry is an entry of a rule's descriptor in a Document.
type DocEntry struct {
	Key   string `yaml:"key" json:"key"`
	Value string `yaml:"value,omitempty" json:"value,omitempty"`
	// Shared makes every value a wildcard value matches count in one bucket (Rule.Shared).
	Shared Scalar `yaml:"shared,omitempty" json:"shared,omitempty"`
}

// descriptorOf validates a descriptor rule's entries.
func descriptorOf(p *problems, where string, des []DocEntry) []Entry {
	if len(des) == 0 || len(des) > MaxDescriptorEntries {
		p.add(where, "descriptor: want 1 to %d entries, got %d", MaxDescriptorEntries, len(des))
		return nil
	}
	es := make([]Entry, len(des))
	for i, de := range des {
		switch {
		case de.Key == "" || len(de.Key) > MaxIdentifierLen:
			p.add(where, "descriptor[%d].key: required, 1 to %d bytes", i, MaxIdentifierLen)
		case len(de.Value) > MaxIdentifierLen:
			p.add(where, "descriptor[%d].value: at most %d bytes", i, MaxIdentifierLen)
		}
		es[i] = Entry{Key: de.Key, Value: de.Value}
	}
	return es
}

// sharedOf validates a descriptor rule's shared entries: only wildcard values share.
func sharedOf(p *problems, where string, des []DocEntry) []bool {
	var shared []bool
	for i, de := range des {
		if de.Shared == "" {
			continue
		}
		b, err := strconv.ParseBool(string(de.Shared))
		switch {
		case err != nil:
			p.add(where, "descriptor[%d].shared: want true or false, got %q", i, de.Shared)
		case b && !strings.HasSuffix(de.Value, "*"):
			p.add(where, "descriptor[%d].shared: only a wildcard value (ending in *) shares its bucket, got %q", i, de.Value)
		case b:
			if shared == nil {
				shared = make([]bool, len(des))
			}
			shared[i] = true
		}
	}
	return shared
}

// customDimension reports whether name is a custom dimension (dimension: tenant): a name of a
// rule id's form that is neither a built-in dimension nor a likely typo of one ("users",
// "api_key"), which would otherwise count silently per a dimension no check names.
func customDimension(name string) bool {
	if _, err := ParseDimension(name); err == nil || !nameRE.MatchString(name) {
		return false
	}
	_, typo := suggest.Closest(strings.ToLower(strings.ReplaceAll(name, "_", "")), dimensionNames[1:])
	return !typo
}

// String returns the entry as key=value.
func (e Entry) String() string { return fmt.Sprintf("%s=%s", e.Key, e.Value) }
