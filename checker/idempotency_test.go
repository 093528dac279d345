package checker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

func TestIdempotencyDigests(t *testing.T) {
	t.Parallel()
	user := Subject{Dimension: rules.DimensionUser, ID: "u1"}
	ip := Subject{Dimension: rules.DimensionIP, ID: "10.0.0.1"}
	base := Query{Subjects: []Subject{user, ip}, Endpoint: "/api/a", Cost: 1, IdempotencyKey: "k"}
	tests := []struct {
		name              string
		edit              func(q *Query)
		sameName, sameReq bool // the record's name, the fingerprint
	}{
		{"identical", func(q *Query) {}, true, true},
		{"subjects in another order", func(q *Query) { q.Subjects = []Subject{ip, user} }, true, true},
		{"another timestamp", func(q *Query) { q.Timestamp = 12345 }, true, true},
		{"another key", func(q *Query) { q.IdempotencyKey = "k2" }, false, true},
		// Issue 20: the shadow record's marker was appended to the key before escaping.
		{"key with a NUL and a marker", func(q *Query) { q.IdempotencyKey = "k\x00shadow" }, false, true},
		{"key with an escaped marker", func(q *Query) { q.IdempotencyKey = "k%00shadow" }, false, true},
		{"another endpoint", func(q *Query) { q.Endpoint = "/api/b" }, true, false},
		{"another cost", func(q *Query) { q.Cost = 2 }, true, false},
		{"an asserted tier", func(q *Query) { q.Tier = "premium" }, true, false},
		{"another identifier", func(q *Query) { q.Subjects = []Subject{{Dimension: rules.DimensionUser, ID: "u2"}, ip} }, false, false},
		{"another dimension", func(q *Query) { q.Subjects = []Subject{{Dimension: rules.DimensionAPIKey, ID: "u1"}, ip} }, false, false},
		{"a subject less", func(q *Query) { q.Subjects = []Subject{user} }, false, false},
		// Fields are length-prefixed: moving bytes from one field to the next is another request.
		{"bytes moved between fields", func(q *Query) { q.Endpoint, q.Tier = "/api/", "a" }, true, false},
		{"bytes moved from key to subject", func(q *Query) {
			q.Subjects, q.IdempotencyKey = []Subject{{Dimension: rules.DimensionUser, ID: "u1k"}, ip}, ""
		}, false, false},
	}
	wantName, wantFP := idempotency(&base)
	if len(wantName) != 22 || len(wantFP) != 16 {
		t.Fatalf("name %q (%d characters), fingerprint of %d bytes; want 22 and 16", wantName, len(wantName), len(wantFP))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := base
			q.Subjects = append([]Subject(nil), base.Subjects...)
			tt.edit(&q)
			name, fp := idempotency(&q)
			if (name == wantName) != tt.sameName {
				t.Errorf("record name %q, base %q: same = %v, want %v", name, wantName, name == wantName, tt.sameName)
			}
			if (fp == wantFP) != tt.sameReq {
				t.Errorf("fingerprint %x, base %x: same = %v, want %v", fp, wantFP, fp == wantFP, tt.sameReq)
			}
		})
	}
	if !reflect.DeepEqual(base.Subjects[0], user) {
		t.Error("idempotency reordered the query's subjects")
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
// request; another request of the same subjects with it is refused with
// ErrIdempotencyConflict, a FieldError on idempotency_key, and charges nothing. Under another
// set of subjects the key is another key: that request is decided and charged as new.
func TestIdempotencyBinding(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, idempotencyRules)})
	ctx := context.Background()
	const (
		replay = iota
		conflict
		fresh
	)
	tests := []struct {
		name string
		edit func(q *Query)
		want int
	}{
		{"same request", func(q *Query) {}, replay},
		{"subjects in another order", func(q *Query) { q.Subjects[0], q.Subjects[1] = q.Subjects[1], q.Subjects[0] }, replay},
		{"another endpoint", func(q *Query) { q.Endpoint = "/api/b" }, conflict},
		{"another cost", func(q *Query) { q.Cost = 2 }, conflict},
		{"another asserted tier", func(q *Query) { q.Tier = "premium" }, conflict},
		{"another subject set", func(q *Query) { q.Subjects = q.Subjects[:1] }, fresh},
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
			switch tt.want {
			case conflict:
				var fe *FieldError
				switch {
				case !errors.Is(err, ErrIdempotencyConflict):
					t.Errorf("got %+v, %v; want ErrIdempotencyConflict", got, err)
				case !errors.As(err, &fe) || fe.Field != "idempotency_key":
					t.Errorf("error %v is not a FieldError on idempotency_key", err)
				case err.Error() != "idempotency_key: already used with another request by these subjects (endpoint, cost or tier differ); use a new key per request":
					t.Errorf("message %q does not name the field and the rule", err)
				}
			case replay:
				if err != nil || !got.Replayed || got.Allowed != first.Allowed || len(got.Limits) != len(first.Limits) {
					t.Errorf("got %+v, %v; want the first decision replayed", got, err)
				}
			case fresh:
				if err != nil || got.Replayed || !got.Allowed {
					t.Errorf("got %+v, %v; want a new decision, allowed", got, err)
				}
			}

			// The first check alone was charged, on every limit; a fresh request once more on
			// its own subjects.
			peek, err := e.Peek(ctx, query())
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range peek.Limits {
				want := int64(9)
				if tt.want == fresh && l.Subject.Dimension == rules.DimensionUser {
					want = 8
				}
				if l.Result.Remaining != want {
					t.Errorf("%s of %s: remaining %d, want %d", l.Rule.ID, l.Subject.ID, l.Result.Remaining, want)
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

// conflictStore is the real bucket.Store, but refuses every keyed request as a store that keeps
// its records elsewhere would: with an error of its own wrapping ErrIdempotencyConflict.
type conflictStore struct{ *bucket.Store }

func (s conflictStore) Send(ctx context.Context, reqs []bucket.Request) bucket.Pending {
	return bucket.Done(s.check(ctx, reqs))
}

func (s conflictStore) check(ctx context.Context, reqs []bucket.Request) ([]bucket.Result, error) {
	for i, r := range reqs {
		if r.IdempotencyKey != "" {
			return nil, fmt.Errorf("records: request %d: %w", i, ErrIdempotencyConflict)
		}
	}
	return s.Store.Check(ctx, reqs)
}

// TestStoreIdempotencyConflict: a store (Config.store) that reports a conflict with the exported
// ErrIdempotencyConflict gets the engine's answer to one, the FieldError on idempotency_key,
// as the Redis store's own conflicts are: there is one sentinel. Before, the
// engine recognized only internal/bucket's error value, not one wrapping it, and
// the guard took the conflict for an outage: the keyed check was allowed, degraded.
func TestStoreIdempotencyConflict(t *testing.T) {
	t.Parallel()
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	store := bucket.NewStore(rdb)
	t.Cleanup(func() { store.Close() })
	e := newEngine(t, Config{store: conflictStore{store}, Rules: checkertest.Rules(t, idempotencyRules)})
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}, Endpoint: "/api/a", Cost: 1}
	if out, err := e.Check(context.Background(), q); err != nil || !out.Allowed {
		t.Fatalf("check without a key: %+v, %v; want allowed", out, err)
	}
	q.IdempotencyKey = "key-1"
	out, err := e.Check(context.Background(), q)
	var fe *FieldError
	const want = "idempotency_key: already used with another request by these subjects (endpoint, cost or tier differ); use a new key per request"
	if !errors.Is(err, ErrIdempotencyConflict) || !errors.As(err, &fe) || err.Error() != want {
		t.Errorf("keyed check: %+v, %v; want the FieldError %q wrapping ErrIdempotencyConflict", out, err, want)
	}
}
