package checker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// TestCompactBuckets: Config.CompactBuckets reaches the store: the token bucket of the test
// rules is written as the compact layout's string instead of the previous layout's hash.
func TestCompactBuckets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		compact bool
		want    string // TYPE of the bucket's key
	}{
		{"previous", false, "hash"},
		{"compact", true, "string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rdb := redisSrv.UniversalClient()
			t.Cleanup(func() { rdb.Close() })
			e := newEngine(t, Config{Redis: rdb, CompactBuckets: tt.compact})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			user := strings.ReplaceAll(t.Name(), "/", "-")
			if out, err := e.Check(ctx, userQuery(user, "/api/x")); err != nil || !out.Allowed {
				t.Fatalf("check: got %+v, %v, want allowed", out, err)
			}
			key := limitKey(subjectTag(1, user), &rules.Rule{Algorithm: bucket.TokenBucket, Window: time.Hour, Endpoint: "/api/*"})
			if got := rdb.Type(ctx, key).Val(); got != tt.want {
				t.Errorf("TYPE %s = %q, want %q", key, got, tt.want)
			}
		})
	}
}
