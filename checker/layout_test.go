package checker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestBucketLayout: Config.BucketLayout reaches the store: the token bucket of the test rules
// is written as the compact layout's string or the previous layout's hash, or as a field of a
// shared hash, with no key of its own, whose count the next check reads.
func TestBucketLayout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		layout BucketLayout
		want   string // TYPE of the bucket's key
	}{
		{PreviousBuckets, "hash"},
		{CompactBuckets, "string"},
		{SharedBuckets, "none"},
		{MixedBuckets, "string"},
	}
	for _, tt := range tests {
		t.Run(tt.layout.String(), func(t *testing.T) {
			t.Parallel()
			rdb := redisSrv.UniversalClient()
			t.Cleanup(func() { rdb.Close() })
			e := newEngine(t, Config{Redis: rdb, BucketLayout: tt.layout})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			user := strings.ReplaceAll(t.Name(), "/", "-")
			if out, err := e.Check(ctx, userQuery(user, "/api/x")); err != nil || !out.Allowed {
				t.Fatalf("check: got %+v, %v, want allowed", out, err)
			}
			key := limitKey(subjectTag(1, user), &rules.Rule{Algorithm: algorithm.TokenBucket, Window: time.Hour, Endpoint: "/api/*"})
			if got := rdb.Type(ctx, key).Val(); got != tt.want {
				t.Errorf("TYPE %s = %q, want %q", key, got, tt.want)
			}
			first, err := e.Check(ctx, userQuery(user, "/api/x"))
			if err != nil || !first.Allowed {
				t.Fatalf("second check: got %+v, %v, want allowed", first, err)
			}
			if again, err := e.Check(ctx, userQuery(user, "/api/x")); err != nil || again.Limits[0].Result.Remaining != first.Limits[0].Result.Remaining-1 {
				t.Errorf("third check: remaining %d (%v), want %d: the bucket's count kept", again.Limits[0].Result.Remaining, err, first.Limits[0].Result.Remaining-1)
			}
		})
	}
}
