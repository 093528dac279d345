package checker

import (
	"errors"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestDescriptorSubjectsApart checks descriptors whose entries hold the bytes keys are made
// of ("{", "}", ":", "=", ",", "%") and values long enough to be hashed: each must count in a
// bucket of its own, on whatever Redis the suite runs on (QUOTAFLOW_TEST_REDIS=cluster: one
// slot per descriptor's hash tag).
func TestDescriptorSubjectsApart(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, `
rules:
  - {id: tenant, dimension: tenant, endpoint: "*", algorithm: fixed_window, limit: 1, window: 1h}
  - {id: pair, dimension: descriptor, endpoint: "*", algorithm: fixed_window, limit: 1, window: 1h, descriptor: [{key: a}, {key: b}]}
`)})
	run := checkertest.ID(t, "d")
	long := strings.Repeat("x", 200)
	descriptors := [][]rules.Entry{
		{{Key: "tenant", Value: run + "{a}:b"}},
		{{Key: "tenant", Value: run + "{a}"}},
		{{Key: "tenant", Value: run + "a=b,c"}},
		{{Key: "tenant", Value: run + "a%3Db%2Cc"}},
		{{Key: "tenant", Value: run + long + "1"}},
		{{Key: "tenant", Value: run + long + "2"}},
		{{Key: "a", Value: run + "x,b=y"}, {Key: "b", Value: "z"}},
		{{Key: "a", Value: run + "x"}, {Key: "b", Value: "y,b=z"}},
		{{Key: "a", Value: run + long}, {Key: "b", Value: long + "1"}},
		{{Key: "a", Value: run + long}, {Key: "b", Value: long + "2"}},
	}
	ids := map[string]bool{}
	for i, es := range descriptors {
		sub := DescriptorSubject(es)
		if ids[sub.ID] {
			t.Fatalf("descriptor %d: identifier %q is another's", i, sub.ID)
		}
		ids[sub.ID] = true
		q := &Query{Subjects: []Subject{sub}, Endpoint: "/x", Cost: 1}
		for j, want := range []bool{true, false} {
			out, err := e.Check(t.Context(), q)
			if err != nil {
				t.Fatalf("descriptor %d check %d: %v", i, j, err)
			}
			if out.Allowed != want || len(out.Limits) != 1 {
				t.Fatalf("descriptor %d (%v) check %d: allowed %v with %d limits, want %v with 1 (a bucket of its own, limit 1)", i, es, j, out.Allowed, len(out.Limits), want)
			}
			if k := limitKey(subjectTag(sub.Dimension, sub.ID), out.Limits[0].Rule); len(k) > maxTagID+64 {
				t.Errorf("descriptor %d: key of %d bytes, want long descriptors hashed", i, len(k))
			}
		}
	}
}

func TestDescriptorSubjectInvalid(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{})
	tests := []struct {
		name string
		sub  Subject
		want string
	}{
		{"no entries", Subject{Dimension: rules.DimensionDescriptor}, "subjects[0].entries: want 1 to 16 entries, got 0"},
		{"empty key", DescriptorSubject([]rules.Entry{{Key: "", Value: "v"}}), "subjects[0].entries[0].key"},
		{"identifier not the entries", Subject{Dimension: rules.DimensionDescriptor, ID: "x", Entries: []rules.Entry{{Key: "k", Value: "v"}}}, `subjects[0].identifier: a descriptor's identifier is its entries written out (DescriptorSubject): want "k=v"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.Check(t.Context(), &Query{Subjects: []Subject{tt.sub}, Endpoint: "/x"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want a FieldError containing %q", err, tt.want)
			}
		})
	}
}

// TestCustomDimensionEachCounts: a check naming its tenant and another custom dimension (region)
// still counts against the tenant's rule, and against a rule of the two together: an extra entry
// takes no check out of a limit. A rule marked unlimited for the whole descriptor is the
// configuration's own exemption.
func TestCustomDimensionEachCounts(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, `
rules:
  - {id: tenant, dimension: tenant, endpoint: "*", algorithm: fixed_window, limit: 3, window: 1h}
  - {id: pair, dimension: descriptor, endpoint: "*", algorithm: fixed_window, limit: 100, window: 1h, descriptor: [{key: tenant}, {key: region, value: eu}]}
  - {id: internal, dimension: descriptor, endpoint: "*", unlimited: true, descriptor: [{key: tenant}, {key: region, value: internal}]}
`)})
	tenant := rules.Entry{Key: "tenant", Value: checkertest.ID(t, "acme")}
	check := func(es ...rules.Entry) *Outcome {
		t.Helper()
		out, err := e.Check(t.Context(), &Query{Subjects: []Subject{DescriptorSubject(es)}, Endpoint: "/x", Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if out := check(tenant); !out.Allowed || len(out.Limits) != 1 {
		t.Fatalf("the tenant alone: %+v, want allowed by its rule", out)
	}
	out := check(tenant, rules.Entry{Key: "region", Value: "eu"})
	var ids []string
	for _, l := range out.Limits {
		ids = append(ids, l.Rule.ID)
	}
	if !out.Allowed || strings.Join(ids, ",") != "pair,tenant" {
		t.Fatalf("tenant and region: allowed %v by %v, want allowed by pair,tenant", out.Allowed, ids)
	}
	if out := check(tenant, rules.Entry{Key: "zone", Value: "b"}); !out.Allowed {
		t.Fatalf("tenant and an entry no rule names: %+v, want the tenant's third, allowed", out)
	}
	for _, extra := range []rules.Entry{{}, {Key: "region", Value: "eu"}, {Key: "zone", Value: "c"}} {
		es := []rules.Entry{tenant}
		if extra.Key != "" {
			es = append(es, extra)
		}
		if out := check(es...); out.Allowed {
			t.Errorf("the tenant's fourth check with %v: allowed, want denied by its limit of 3", es)
		}
	}
	if out := check(tenant, rules.Entry{Key: "region", Value: "internal"}); !out.Allowed || len(out.Limits) != 0 {
		t.Errorf("a descriptor a rule marks unlimited: %+v, want allowed by no limit", out)
	}
}

// TestCustomDimensionMaxValues: a caller naming a new tenant per check gets at most the rule's
// max_values of them counted in a window; the next new one is refused naming custom_dimension,
// while tenants already counted go on.
func TestCustomDimensionMaxValues(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, `
rules:
  - {id: tenant, dimension: tenant, endpoint: "*", algorithm: fixed_window, limit: 5, window: 1h, max_values: 3}
`)})
	run := checkertest.ID(t, "t")
	check := func(tenant string) (*Outcome, error) {
		return e.Check(t.Context(), &Query{Subjects: []Subject{DescriptorSubject([]rules.Entry{{Key: "tenant", Value: run + tenant}})}, Endpoint: "/x", Cost: 1})
	}
	for _, tenant := range []string{"a", "b", "c", "a"} {
		if out, err := check(tenant); err != nil || !out.Allowed {
			t.Fatalf("tenant %s: %+v, %v; want allowed", tenant, out, err)
		}
	}
	var fe *FieldError
	if _, err := check("d"); !errors.As(err, &fe) || fe.Field != "custom_dimension" || !strings.Contains(fe.Msg, "max_values") {
		t.Fatalf("a fourth tenant: %v, want a FieldError naming custom_dimension and max_values", err)
	}
	if out, err := check("b"); err != nil || !out.Allowed {
		t.Errorf("a tenant counted already: %+v, %v; want allowed", out, err)
	}
	if _, err := mustRulesErr(`rules:
  - {id: u, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 5, window: 1h, max_values: 3}
`); err == nil || !strings.Contains(err.Error(), "max_values: only descriptor rules") {
		t.Errorf("max_values on a user rule: %v, want refused", err)
	}
}

func mustRulesErr(doc string) (*rules.Set, error) { return rules.Parse([]byte(doc)) }
