package checker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestQueryValidation: Check and Peek validate the Query they are given, whoever built it,
// and refuse a broken one with a FieldError naming the field, before anything is charged.
// Before, the engine trusted its transports: a Query built by a program of its own reached
// the store with no subject dimension, a negative cost or an empty identifier.
func TestQueryValidation(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, testRules)})
	user := func(id string) Subject { return Subject{Dimension: rules.DimensionUser, ID: id} }
	tests := []struct {
		name string
		q    Query
		want string
	}{
		{"no dimension", Query{Subjects: []Subject{{ID: "u"}}, Endpoint: "/api/x", Cost: 1},
			"subjects[0].dimension: unknown dimension 0: want user, ip, apikey or descriptor"},
		{"the global subject", Query{Subjects: []Subject{user("u"), {Dimension: rules.DimensionGlobal, ID: "global"}}, Endpoint: "/api/x", Cost: 1},
			"subjects[1].dimension: the global subject cannot be named: global rules apply to every request"},
		{"two users", Query{Subjects: []Subject{user("u"), user("v")}, Endpoint: "/api/x", Cost: 1},
			"subjects[1].dimension: the query names two user subjects; name one of each dimension"},
		{"empty identifier", Query{Subjects: []Subject{user("")}, Endpoint: "/api/x", Cost: 1},
			"subjects[0].identifier: required"},
		{"long identifier", Query{Subjects: []Subject{user(strings.Repeat("u", MaxIdentifierLen+1))}, Endpoint: "/api/x", Cost: 1},
			"subjects[0].identifier: must be at most 256 bytes, got 257"},
		{"identifier not UTF-8", Query{Subjects: []Subject{{Dimension: rules.DimensionIP, ID: "a\xff"}}, Endpoint: "/api/x", Cost: 1},
			"subjects[0].identifier: must be valid UTF-8"},
		{"no endpoint", Query{Subjects: []Subject{user("u")}, Cost: 1},
			"endpoint: required"},
		{"endpoint above the root", Query{Subjects: []Subject{user("u")}, Endpoint: "/api/../../x", Cost: 1},
			`endpoint: "/api/../../x" climbs above the root with ".."`},
		{"negative cost", Query{Subjects: []Subject{user("u")}, Endpoint: "/api/x", Cost: -1},
			"cost: must not be negative, got -1"},
		{"cost above MaxCost", Query{Subjects: []Subject{user("u")}, Endpoint: "/api/x", Cost: MaxCost + 1},
			"cost: must be at most 1000000, got 1000001"},
		{"long idempotency key", Query{Subjects: []Subject{user("u")}, Endpoint: "/api/x", IdempotencyKey: strings.Repeat("k", MaxIdempotentLen+1), Cost: 1},
			"idempotency_key: must be at most 256 bytes, got 257"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for name, decide := range map[string]func(context.Context, *Query) (*Outcome, error){"check": e.Check, "peek": e.Peek} {
				out, err := decide(context.Background(), &tt.q)
				var fe *FieldError
				if !errors.As(err, &fe) || err.Error() != tt.want {
					t.Errorf("%s: got %+v, %v; want the FieldError %q", name, out, err, tt.want)
				}
			}
		})
	}
}

// TestQueryZeroCost: a Query's zero Cost is one unit, as its zero value should be usable;
// the caller's Query is left as it is.
func TestQueryZeroCost(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, testRules)})
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}, Endpoint: "/api/x"}
	for want := int64(3); want >= 2; want-- {
		out, err := e.Check(context.Background(), q)
		if err != nil || !out.Allowed || out.Limits[0].Result.Remaining != want {
			t.Fatalf("check of cost 0: %+v, %v; want allowed with %d of 4 remaining", out, err, want)
		}
	}
	if q.Cost != 0 {
		t.Errorf("the caller's Query's cost is now %d, want 0", q.Cost)
	}
}

// TestResetValidation: Reset refuses a request naming no valid subject, named as
// ResetLimitRequest's fields.
func TestResetValidation(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, testRules)})
	tests := []struct {
		name string
		r    ResetRequest
		want string
	}{
		{"no dimension", ResetRequest{Subject: Subject{ID: "u"}}, "dimension: unknown dimension 0: want user, ip, apikey or descriptor"},
		{"empty identifier", ResetRequest{Subject: Subject{Dimension: rules.DimensionUser}}, "identifier: required"},
		{"bad endpoint", ResetRequest{Subject: Subject{Dimension: rules.DimensionUser, ID: "u"}, Endpoint: "api"}, `endpoint: "api" must be an absolute path, starting with "/"`},
		{"unknown rule", ResetRequest{Subject: Subject{Dimension: rules.DimensionUser, ID: "u"}, RuleID: "nope"}, `rule_id: no rule has id "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := e.Reset(context.Background(), tt.r)
			if fe := (*FieldError)(nil); !errors.As(err, &fe) || err.Error() != tt.want {
				t.Errorf("got %v, want the FieldError %q", err, tt.want)
			}
		})
	}
}
