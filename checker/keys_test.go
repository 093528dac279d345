package checker

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// FuzzCheckRequest: the engine's validation of a Query (normalQuery) accepts only what it
// promises, and no accepted identifier escapes its key's hash tag. The transports' translation
// of their requests has a fuzz target of its own (checker/transport).
func FuzzCheckRequest(f *testing.F) {
	f.Add("user-1", int32(1), "/api/v1/orders", int64(1), int64(0), "", "", "10.0.0.1", int32(2))
	f.Add("", int32(0), "", int64(-1), int64(1), "k", "premium", "", int32(4))
	f.Add("a\xff", int32(3), "/x\x00y", int64(1_000_001), int64(1<<62), "\xfe", "free", "b", int32(1))
	f.Add("{user:1}", int32(1), "*", int64(0), time.Now().UnixMilli(), "idem", "", "::1", int32(7))
	f.Fuzz(func(t *testing.T, ident string, dim int32, endpoint string, cost, ts int64, idem, tier, other string, otherDim int32) {
		q := &Query{Subjects: []Subject{{Dimension: rules.Dimension(dim), ID: ident}}, Endpoint: endpoint,
			Cost: cost, Timestamp: ts, IdempotencyKey: idem, Tier: tier}
		if other != "" {
			q.Subjects = append(q.Subjects, Subject{Dimension: rules.Dimension(otherDim), ID: other})
		}
		q, err := normalQuery(q)
		if err != nil {
			if fe := (*FieldError)(nil); !errors.As(err, &fe) {
				t.Fatalf("error %v is not a FieldError", err)
			}
			return
		}
		if len(q.Subjects) == 0 || q.Cost < 1 || q.Cost > MaxCost || !utf8.ValidString(q.Endpoint) || len(q.Endpoint) > MaxEndpointLen ||
			len(q.IdempotencyKey) > MaxIdempotentLen || !utf8.ValidString(q.IdempotencyKey) {
			t.Fatalf("accepted an invalid request: %+v", q)
		}
		seen := map[any]bool{}
		for _, s := range q.Subjects {
			if s.ID == "" || len(s.ID) > MaxIdentifierLen || !utf8.ValidString(s.ID) || !s.Dimension.Valid() ||
				s.Dimension == rules.DimensionGlobal || seen[s.Dimension] {
				t.Fatalf("accepted an invalid subject: %+v", s)
			}
			seen[s.Dimension] = true
			// Whatever the identifier holds, its key stays inside its own hash tag.
			tag := subjectTag(s.Dimension, s.ID)
			if strings.Count(tag, "{") != 1 || strings.Count(tag, "}") != 1 || strings.ContainsAny(tag[1:len(tag)-1], "{}") {
				t.Fatalf("subject %q escapes its hash tag: %q", s.ID, tag)
			}
		}
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	set := mustRules(t, testRules)
	r, _ := set.Rule("user-api")
	tests := []struct{ id, want string }{
		{"12345", "rl:{user:12345}:tb:1h:/api/*"},
		{"a}:tb:1h:/x", "rl:{user:a%7D%3Atb%3A1h%3A/x}:tb:1h:/api/*"},
		{"{user:1}", "rl:{user:%7Buser%3A1%7D}:tb:1h:/api/*"},
		{"ünï cödé", "rl:{user:%C3%BCn%C3%AF%20c%C3%B6d%C3%A9}:tb:1h:/api/*"},
	}
	for _, tt := range tests {
		if got := limitKey(subjectTag(r.Dimension, tt.id), r); got != tt.want {
			t.Errorf("key for %q = %q, want %q", tt.id, got, tt.want)
		}
	}
	for d, want := range map[time.Duration]string{time.Second: "1s", 90 * time.Second: "90s", time.Minute: "1m",
		2 * time.Hour: "2h", 24 * time.Hour: "1d", 1500 * time.Millisecond: "1500ms"} {
		if got := windowToken(d); got != want {
			t.Errorf("windowToken(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestAllowanceKey: the admin API's token buckets keep the key they had when the admin API
// built it, in a namespace no subject can reach.
func TestAllowanceKey(t *testing.T) {
	t.Parallel()
	if got, want := allowanceKey("admin", "0123abcd", "write"), "rl:{admin:0123abcd}:tb:1m:write"; got != want {
		t.Errorf("allowanceKey = %q, want %q", got, want)
	}
	if got := subjectTag(1, "admin:0123abcd"); got == "{admin:0123abcd}" {
		t.Errorf("a user id reaches the admin namespace: %q", got)
	}
}
