package checker

import (
	"context"
	"errors"
	"testing"

	"github.com/quotaflow/quotaflow/internal/checkertest"
	"github.com/quotaflow/quotaflow/internal/rules"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	user := Subject{Dimension: rules.DimensionUser, ID: "u1"}
	ip := Subject{Dimension: rules.DimensionIP, ID: "10.0.0.1"}
	base := Query{Subjects: []Subject{user, ip}, Endpoint: "/api/a", Cost: 1, IdempotencyKey: "k"}
	tests := []struct {
		name string
		edit func(q *Query)
		same bool
	}{
		{"identical", func(q *Query) {}, true},
		{"subjects in another order", func(q *Query) { q.Subjects = []Subject{ip, user} }, true},
		{"another key", func(q *Query) { q.IdempotencyKey = "k2" }, true},
		{"another timestamp", func(q *Query) { q.Timestamp = 12345 }, true},
		{"another endpoint", func(q *Query) { q.Endpoint = "/api/b" }, false},
		{"another cost", func(q *Query) { q.Cost = 2 }, false},
		{"another identifier", func(q *Query) { q.Subjects = []Subject{{Dimension: rules.DimensionUser, ID: "u2"}, ip} }, false},
		{"another dimension", func(q *Query) { q.Subjects = []Subject{{Dimension: rules.DimensionAPIKey, ID: "u1"}, ip} }, false},
		{"a subject less", func(q *Query) { q.Subjects = []Subject{user} }, false},
		{"an asserted tier", func(q *Query) { q.Tier = "premium" }, false},
		// Fields are length-prefixed: moving bytes from one field to the next is another request.
		{"bytes moved between fields", func(q *Query) { q.Endpoint, q.Tier = "/api/", "a" }, false},
	}
	want := fingerprint(&base)
	if len(want) != 32 {
		t.Fatalf("fingerprint %q: %d characters, want 32 (16 bytes in hex)", want, len(want))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := base
			q.Subjects = append([]Subject(nil), base.Subjects...)
			tt.edit(&q)
			if got := fingerprint(&q); (got == want) != tt.same {
				t.Errorf("fingerprint %q, base %q: same = %v, want %v", got, want, got == want, tt.same)
			}
		})
	}
	if base.Subjects[0] != user {
		t.Error("fingerprint reordered the query's subjects")
	}
}

const idempotencyRules = `
default_tier: free
tiers: {free: {}, premium: {}}
rules:
  - {id: user-api, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 10, window: 1h}
  - {id: ip-api, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 10, window: 1h}
  - {id: user-api-shadow, dimension: user, endpoint: /api/*, algorithm: sliding_window_counter, limit: 10, window: 1h, shadow: true}
`

// TestIdempotencyBinding: a key replays its first decision, uncharged, only for the same
// request; any other request with it is refused with ErrIdempotencyConflict, a FieldError on
// idempotency_key, and charges nothing.
func TestIdempotencyBinding(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, idempotencyRules)})
	ctx := context.Background()
	tests := []struct {
		name     string
		edit     func(q *Query)
		conflict bool
	}{
		{"same request", func(q *Query) {}, false},
		{"subjects in another order", func(q *Query) { q.Subjects[0], q.Subjects[1] = q.Subjects[1], q.Subjects[0] }, false},
		{"another endpoint", func(q *Query) { q.Endpoint = "/api/b" }, true},
		{"another cost", func(q *Query) { q.Cost = 2 }, true},
		{"another subject set", func(q *Query) { q.Subjects = q.Subjects[:1] }, true},
		{"another asserted tier", func(q *Query) { q.Tier = "premium" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			query := func() *Query {
				return &Query{
					Subjects: []Subject{
						{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")},
						{Dimension: rules.DimensionIP, ID: checkertest.ID(t, "ip")},
					},
					Endpoint: "/api/a", Cost: 1, IdempotencyKey: "key-1",
				}
			}
			first, err := e.Check(ctx, query())
			if err != nil || !first.Allowed || first.Replayed {
				t.Fatalf("first check: %+v, %v; want allowed, not replayed", first, err)
			}
			q := query()
			tt.edit(q)
			got, err := e.Check(ctx, q)
			if tt.conflict {
				var fe *FieldError
				switch {
				case !errors.Is(err, ErrIdempotencyConflict):
					t.Errorf("got %+v, %v; want ErrIdempotencyConflict", got, err)
				case !errors.As(err, &fe) || fe.Field != "idempotency_key":
					t.Errorf("error %v is not a FieldError on idempotency_key", err)
				case err.Error() != "idempotency_key: already used with another request (subjects, endpoint, cost or tier differ); use a new key per request":
					t.Errorf("message %q does not name the field and the rule", err)
				}
			} else if err != nil || !got.Replayed || got.Allowed != first.Allowed || len(got.Limits) != len(first.Limits) {
				t.Errorf("got %+v, %v; want the first decision replayed", got, err)
			}

			// Whatever the answer, the first check alone was charged, on every limit.
			peek, err := e.Peek(ctx, query())
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range peek.Limits {
				if l.Result.Remaining != 9 {
					t.Errorf("%s of %s: remaining %d, want 9 (charged once)", l.Rule.ID, l.Subject.ID, l.Result.Remaining)
				}
			}
			// A conflict is the caller's mistake, not an outage: the next check is exact.
			q = query()
			q.IdempotencyKey = "key-2"
			if next, err := e.Check(ctx, q); err != nil || next.Degraded || next.Replayed || !next.Allowed {
				t.Errorf("check with a new key: %+v, %v; want allowed, exact, not replayed", next, err)
			}
		})
	}
}
