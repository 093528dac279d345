package checker

import (
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestExemptions: an exempt subject's checks pass the rules they are exempt from (all, or the
// listed ones) and are still decided by the others, with the exemption's id on the outcome (the
// stream's and the audit's exemption); other subjects are limited as before.
func TestExemptions(t *testing.T) {
	t.Parallel()
	run := checkertest.ID(t, "x")
	e := newEngine(t, Config{Rules: mustRules(t, `
rules:
  - {id: per-user, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: per-ip, dimension: ip, endpoint: /x, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: per-tenant, dimension: tenant, endpoint: /x, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: everyone, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 1000000, window: 1h}
exemptions:
  - {id: office, dimension: ip, value: 10.77.0.0/16, reason: office NAT}
  - {id: ops-bot, dimension: user, value: bot-`+run+`, rules: [per-user]}
  - {id: acme, dimension: tenant, value: acme-`+run+`}
  - {id: mapped, dimension: ip, value: "::ffff:10.88.0.0/112"}
`)})
	user := func(id string) Subject { return Subject{Dimension: rules.DimensionUser, ID: id} }
	ip := func(a string) Subject { return Subject{Dimension: rules.DimensionIP, ID: a} }
	tests := []struct {
		name      string
		subjects  []Subject
		allowed   []bool
		exemption string
		limits    int // per check
	}{
		{"exempt network: no rule at all, the global one neither", []Subject{ip("10.77.3.4")}, []bool{true, true, true}, "office", 0},
		{"IPv4-mapped exemption", []Subject{ip("10.88.0.9")}, []bool{true, true}, "mapped", 0},
		{"other network", []Subject{ip("10.78.3.4")}, []bool{true, false}, "", 2},
		{"user exempt from its rule only", []Subject{user("bot-" + run), ip("192.0.2." + run[len(run)-1:])}, []bool{true, false}, "ops-bot", 2},
		{"exempt tenant", []Subject{DescriptorSubject([]rules.Entry{{Key: "tenant", Value: "acme-" + run}})}, []bool{true, true, true}, "acme", 0},
		{"other tenant", []Subject{DescriptorSubject([]rules.Entry{{Key: "tenant", Value: "other-" + run}})}, []bool{true, false}, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, want := range tt.allowed {
				out, err := e.Check(t.Context(), &Query{Subjects: tt.subjects, Endpoint: "/x"})
				if err != nil {
					t.Fatal(err)
				}
				if out.Allowed != want || out.Exemption != tt.exemption || len(out.Limits) != tt.limits {
					t.Errorf("check %d: allowed %v exemption %q with %d limits, want %v %q %d", i, out.Allowed, out.Exemption, len(out.Limits), want, tt.exemption, tt.limits)
				}
			}
		})
	}
}
