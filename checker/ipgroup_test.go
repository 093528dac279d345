package checker

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

const ipRules = `
rules:
  - {id: ip-default, dimension: ip, endpoint: /default, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: ip-exact, dimension: ip, endpoint: /exact, algorithm: fixed_window, limit: 2, window: 1h, ipv6_prefix: 128}
  - {id: ip-48, dimension: ip, endpoint: /wide, algorithm: sliding_window_log, limit: 2, window: 1h, ipv6_prefix: 48, ipv4_prefix: 24}
  - {id: ip-mixed-net, dimension: ip, endpoint: /mixed, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: ip-mixed-addr, dimension: ip, endpoint: /mixed, algorithm: token_bucket, limit: 1, window: 1h, ipv6_prefix: 128}
`

// net6 is an IPv6 /48 of the running test's own: "2001:db8:xxxx" (a run's buckets are its own).
func net6(t testing.TB, name string) string {
	h := fnv.New32a()
	h.Write([]byte(checkertest.ID(t, name)))
	return fmt.Sprintf("2001:db8:%x", uint16(h.Sum32()))
}

// TestIPNetworks: an ip rule counts the network of its prefix length, not the address: every
// address of a /64 (the default) is one bucket, spellings of one address (zones, IPv4-mapped
// forms) are one address, and each rule of a check groups by its own prefix.
func TestIPNetworks(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, ipRules)})
	ctx := context.Background()
	type step struct {
		ip      string
		allowed bool
	}
	for _, tt := range []struct {
		name, endpoint string
		steps          func(n string, v4 string) []step
	}{
		{"one /64 is one bucket", "/default", func(n, _ string) []step {
			return []step{{n + ":1::1", true}, {n + ":1:ffff:ffff:ffff:ffff", true}, {n + ":1::abcd", false}, {n + ":2::1", true}}
		}},
		{"zones and spellings are one address", "/exact", func(n, _ string) []step {
			return []step{{"fe80::" + n[9:] + "%eth0", true}, {"fe80:0:0:0:0:0:0:" + n[9:] + "%eth1", true}, {"FE80::" + n[9:], false},
				{n + "::1", true}, {n + ":0::0:1", true}, {n + "::2", true}}
		}},
		{"IPv4-mapped is IPv4", "/default", func(_, v4 string) []step {
			return []step{{"::ffff:" + v4, true}, {v4, true}, {"::FFFF:" + v4, false}}
		}},
		{"the rule's own prefixes", "/wide", func(n, v4 string) []step {
			// v4 is 10.x.y.z: z's last digit changed stays in the /24.
			return []step{{n + ":1::1", true}, {n + ":ffff::1", true}, {n + ":7::1", false}, {net6(t, "other") + "::1", true},
				{v4[:len(v4)-1] + "1", true}, {v4[:len(v4)-1] + "2", true}, {v4[:len(v4)-1] + "3", false}}
		}},
		{"rules of one check group apart", "/mixed", func(n, _ string) []step {
			// ip-mixed-addr allows one per address, ip-mixed-net three per /64.
			return []step{{n + ":1::1", true}, {n + ":1::1", false}, {n + ":1::2", true}, {n + ":1::3", true}, {n + ":1::4", false}}
		}},
		{"a name that is no address is counted as it is", "/default", func(n, _ string) []step {
			return []step{{n + "-gw", true}, {n + "-gw", true}, {n + "-gw", false}, {n + "-gw2", true}}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n, v4 := net6(t, "n"), checkertest.IP(t, "v4")
			for i, st := range tt.steps(n, v4) {
				out, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionIP, ID: st.ip}}, Endpoint: tt.endpoint, Cost: 1})
				if err != nil {
					t.Fatalf("check %d (%s): %v", i, st.ip, err)
				}
				if out.Allowed != st.allowed {
					t.Errorf("check %d (%s): allowed %v, want %v (limits %+v)", i, st.ip, out.Allowed, st.allowed, out.Limits)
				}
			}
		})
	}
}

// TestIPNetworkSubject: a limit reports the network it counts (what warnings, overrides and
// the decision's statuses name), and a reset of any address resets its networks' buckets.
func TestIPNetworkSubject(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, ipRules)})
	ctx := context.Background()
	n := net6(t, "n")
	check := func(ip string) *Outcome {
		t.Helper()
		out, err := e.Check(ctx, &Query{Subjects: []Subject{{Dimension: rules.DimensionIP, ID: ip}}, Endpoint: "/mixed", Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := check(n + ":5::1%eth0")
	got := map[string]string{}
	for _, l := range out.Limits {
		got[l.Rule.ID] = l.Subject.ID
	}
	if want := (map[string]string{"ip-mixed-net": n + ":5::/64", "ip-mixed-addr": n + ":5::1"}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statuses name %v, want %v", got, want)
	}
	check(n + ":5::2")
	check(n + ":5::3")
	if check(n + ":5::4").Allowed {
		t.Fatal("a fourth address of the /64 allowed")
	}
	if _, _, err := e.Reset(ctx, ResetRequest{Subject: Subject{Dimension: rules.DimensionIP, ID: n + ":5::99"}}); err != nil {
		t.Fatal(err)
	}
	if !check(n + ":5::4").Allowed {
		t.Error("after a reset of an address of the /64, its network is still denied")
	}
}
