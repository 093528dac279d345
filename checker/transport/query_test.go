package transport

import (
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/field"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// FuzzCheckRequest: the translation of a CheckRateLimit request into a Query accepts only
// valid queries, and refuses the others with a FieldError. (The engine's own validation, and
// the keys of what it accepts, are fuzzed in package checker.)
func FuzzCheckRequest(f *testing.F) {
	f.Add("user-1", int32(1), "/api/v1/orders", int64(1), int64(0), "", "", "10.0.0.1", int32(2))
	f.Add("", int32(0), "", int64(-1), int64(1), "k", "premium", "", int32(4))
	f.Add("a\xff", int32(3), "/x\x00y", int64(1_000_001), int64(1<<62), "\xfe", "free", "b", int32(1))
	f.Add("{user:1}", int32(1), "*", int64(0), time.Now().UnixMilli(), "idem", "", "::1", int32(7))
	now := time.Now()
	f.Fuzz(func(t *testing.T, ident string, dim int32, endpoint string, cost, ts int64, idem, tier, other string, otherDim int32) {
		req := &quotaflowv1.CheckRateLimitRequest{Identifier: ident, Dimension: quotaflowv1.Dimension(dim), Endpoint: endpoint,
			Cost: cost, Timestamp: ts, IdempotencyKey: idem, Tier: tier}
		if other != "" {
			req.Subjects = []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension(otherDim), Identifier: other}}
		}
		q, err := checkQuery(req, now)
		if err != nil {
			if fe := (*field.Error)(nil); !errors.As(err, &fe) {
				t.Fatalf("error %v is not a FieldError", err)
			}
			return
		}
		if len(q.Subjects) == 0 || q.Cost < 1 || q.Cost > checker.MaxCost || !utf8.ValidString(q.Endpoint) || len(q.Endpoint) > checker.MaxEndpointLen {
			t.Fatalf("accepted an invalid request: %+v", q)
		}
		seen := map[any]bool{}
		for _, s := range q.Subjects {
			if s.ID == "" || len(s.ID) > checker.MaxIdentifierLen || !utf8.ValidString(s.ID) || !s.Dimension.Valid() || seen[s.Dimension] {
				t.Fatalf("accepted an invalid subject: %+v", s)
			}
			seen[s.Dimension] = true
		}
	})
}
