package rules

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// A candidate rule (candidate_of: <live rule id>) is a change proposed to a live rule, run
// beside it on live traffic: evaluated on exactly the checks the live rule is evaluated on,
// charged in the same script run, never enforced, its answers recorded next to the live
// rule's. It is planned from its live rule, never matched on its own, so that it takes the
// live rule's dimension, endpoint, tier and descriptor: a candidate that named others would
// answer other checks, and nothing could be compared. What it leaves out of the rest (the
// algorithm, limit, window, fail mode, warning thresholds; the burst, count_denied,
// on_limit, max_delay, timezone and anchor_day unless it names another algorithm or window)
// is the live rule's, so that "candidate_of: search, limit: 3" is the live rule with one
// number changed.

// withCandidates returns docs with every candidate completed from its live rule, reporting
// what a candidate may not say. docs is not modified.
func withCandidates(p *problems, docs []DocRule) []DocRule {
	var out []DocRule
	for i := range docs {
		c := &docs[i]
		if c.CandidateOf == "" {
			continue
		}
		if out == nil {
			out = slices.Clone(docs)
		}
		where := fmt.Sprintf("rules[%d]", i)
		if c.ID != "" {
			where = ruleWhere(c.ID, i)
		}
		j := slices.IndexFunc(docs, func(r DocRule) bool { return r.ID == c.CandidateOf })
		if j < 0 {
			p.add(where, "candidate_of: no rule has id %q", c.CandidateOf)
			continue
		}
		out[i] = completeCandidate(p, where, c, &docs[j])
	}
	if out == nil {
		return docs
	}
	return out
}

// completeCandidate returns candidate c of live rule l with what it leaves out taken from l.
func completeCandidate(p *problems, where string, c, l *DocRule) DocRule {
	switch {
	case l.CandidateOf != "":
		p.add(where, "candidate_of: %q is itself a candidate (of %q); name the live rule", l.ID, l.CandidateOf)
	case isTrue(l.Unlimited):
		p.add(where, "candidate_of: %q is unlimited: it limits nothing to compare with", l.ID)
	case l.Lease != nil:
		// Decided from a checker's slices, without the script run a candidate rides in.
		p.add(where, "candidate_of: %q is leased (lease:), decided without Redis; a candidate is decided in its live rule's script call", l.ID)
	}
	// What says which checks a rule applies to is the live rule's.
	for _, f := range []struct {
		name string
		same bool
	}{
		{"dimension", c.Dimension == "" || c.Dimension == l.Dimension},
		{"endpoint", c.Endpoint == "" || c.Endpoint == l.Endpoint},
		{"tier", c.Tier == "" || c.Tier == l.Tier},
		{"descriptor", len(c.Descriptor) == 0 || slices.Equal(c.Descriptor, l.Descriptor)},
		{"ipv6_prefix", c.IPv6Prefix == "" || c.IPv6Prefix == l.IPv6Prefix},
		{"ipv4_prefix", c.IPv4Prefix == "" || c.IPv4Prefix == l.IPv4Prefix},
	} {
		if !f.same {
			p.add(where, "%s: a candidate is evaluated on its live rule's checks and takes its %s (%q's); leave it out", f.name, f.name, l.ID)
		}
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"shadow", c.Shadow != ""}, {"lease", c.Lease != nil}, {"name", c.Name != ""}, {"replaces", len(c.Replaces) > 0},
		{"unlimited", c.Unlimited != ""}, {"quota_mode", c.QuotaMode != ""},
	} {
		if f.set {
			p.add(where, "%s: a candidate takes none (it is never enforced, and matches as its live rule %q does)", f.name, l.ID)
		}
	}
	m := *c
	m.Dimension, m.Endpoint, m.Tier, m.Descriptor = l.Dimension, l.Endpoint, l.Tier, l.Descriptor
	m.IPv6Prefix, m.IPv4Prefix = l.IPv6Prefix, l.IPv4Prefix
	sameAlgorithm := c.Algorithm == "" || c.Algorithm == l.Algorithm
	sameWindow := c.Window == "" || c.Window == l.Window
	inherit(&m.Algorithm, l.Algorithm)
	inherit(&m.Limit, l.Limit)
	inherit(&m.Window, l.Window)
	inherit(&m.FailMode, l.FailMode)
	if m.Warning == nil {
		m.Warning = l.Warning
	}
	if sameAlgorithm {
		inherit(&m.Burst, l.Burst)
		inherit(&m.CountDenied, l.CountDenied)
		inherit(&m.OnLimit, l.OnLimit)
		inherit(&m.MaxDelay, l.MaxDelay)
	}
	if sameWindow {
		inherit(&m.Timezone, l.Timezone)
		inherit(&m.AnchorDay, l.AnchorDay)
	}
	if a, err := algorithm.Parse(m.Algorithm); err == nil && a == algorithm.Concurrency {
		// A denied check keeps a candidate's charge when only its live rule denied it (as if
		// the candidate had replaced it): a place in flight so taken would have no holder to
		// release it.
		p.add(where, "algorithm: a candidate cannot count places in flight (concurrency); compare a rate instead")
	}
	return m
}

// inherit sets *v to live's value when the candidate left it out.
func inherit[T ~string](v *T, live T) {
	if *v == "" {
		*v = live
	}
}

// isTrue reports whether a rule's boolean field says true (its own validation reports a
// value that is no boolean).
func isTrue(v Scalar) bool {
	b, _ := strconv.ParseBool(string(v))
	return b
}
