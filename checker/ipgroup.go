package checker

import (
	"net/netip"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// An ip rule counts networks, not addresses: a client that owns an IPv6 /64 (every SLAAC host
// does) would otherwise have 2^64 buckets. Each rule says how many leading bits make its
// network (rules.Rule.PrefixBits: /64 and /32 by default), so grouping happens here, where a
// rule's bucket key is planned, on every protocol alike. An identifier is canonicalised
// first: IPv4-mapped IPv6 addresses are their IPv4 address, a zone (fe80::1%eth0, which
// X-Forwarded-For may carry) is dropped, and every spelling of one address is one. An
// identifier that is no IP address is counted as it is: the check API lets services name ip
// subjects, and such a name has no network to group.

// subjectIP returns the canonical address of an ip subject's identifier, and whether it is one.
func subjectIP(id string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(id)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// networkID is the identifier of the network r counts a in: the address itself when r counts
// whole addresses ("192.0.2.7"), else its network ("2001:db8::/64"). The prefix length is part
// of it, so that rules grouping by different lengths never share a bucket.
func networkID(a netip.Addr, r *rules.Rule) string {
	bits := r.PrefixBits(a.Is4())
	if bits >= a.BitLen() {
		return a.String()
	}
	p, err := a.Prefix(bits)
	if err != nil { // bits out of range: rules.Compile refuses such rules
		return a.String()
	}
	return p.String()
}

// ipGroups calls fn once per network that the rules rs count the ip subject addr in, with the
// network's subject and the rules that count it (rs itself when all agree, the usual case).
func ipGroups(addr netip.Addr, rs []*rules.Rule, fn func(sub Subject, rs []*rules.Rule) error) error {
	first := networkID(addr, rs[0])
	same := true
	for _, r := range rs[1:] {
		if networkID(addr, r) != first {
			same = false
			break
		}
	}
	if same {
		return fn(Subject{Dimension: rules.DimensionIP, ID: first}, rs)
	}
	var order []string
	groups := map[string][]*rules.Rule{}
	for _, r := range rs {
		id := networkID(addr, r)
		if groups[id] == nil {
			order = append(order, id)
		}
		groups[id] = append(groups[id], r)
	}
	for _, id := range order {
		if err := fn(Subject{Dimension: rules.DimensionIP, ID: id}, groups[id]); err != nil {
			return err
		}
	}
	return nil
}
