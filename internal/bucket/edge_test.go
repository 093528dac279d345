package bucket

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// TestStoreClockBack writes states stamped an hour ahead of Redis time, as a clock stepping
// back would leave them: no algorithm may refill from them.
func TestStoreClockBack(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	const L, W = 5, 100 * time.Millisecond
	wus := W.Microseconds()
	ahead := c.Time(ctxT(t)).Val().Add(time.Hour).UnixMicro()
	wid := ahead / wus
	str := func(v int64) string { return strconv.FormatInt(v, 10) }
	tests := []struct {
		alg   algorithm.ID
		write func(ctx context.Context, k string) error
	}{
		{algorithm.TokenBucket, func(ctx context.Context, k string) error {
			return c.HSet(ctx, k, "tk", "0", "ts", str(ahead), "cap", str(L)).Err()
		}},
		{algorithm.LeakyBucket, func(ctx context.Context, k string) error { return c.HSet(ctx, k, "lv", str(L), "ts", str(ahead)).Err() }},
		{algorithm.FixedWindow, func(ctx context.Context, k string) error { return c.HSet(ctx, k, "w", str(wid), "n", str(L)).Err() }},
		{algorithm.SlidingWindowCounter, func(ctx context.Context, k string) error {
			return c.HSet(ctx, k, "w", str(wid), "c", str(L), "p", "0").Err()
		}},
		{algorithm.SlidingWindowLog, func(ctx context.Context, k string) error {
			for j := 1; j <= L; j++ {
				if err := c.ZAdd(ctx, k, zmember(ahead, j)).Err(); err != nil {
					return err
				}
			}
			return nil
		}},
		{algorithm.GCRA, func(ctx context.Context, k string) error { return c.Set(ctx, k, str(ahead), 0).Err() }},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), tt.alg, L, W, 0)
			// A context of the subtest's own: parallel subtests may start long after their
			// parent returned, past a deadline set then.
			if err := tt.write(ctxT(t), l.Key); err != nil {
				t.Fatalf("writing the state: %v", err)
			}
			res := check(t, s, one(l, 1))
			checkInvariants(t, one(l, 1), res)
			if res.Allowed || res.Limits[0].Remaining != 0 {
				t.Errorf("got allowed %v remaining %d, want false 0", res.Allowed, res.Limits[0].Remaining)
			}
		})
	}
}

// zmember is a sliding window log member as the script's previous version wrote them: one per
// unit, "<t>-<j>".
func zmember(t int64, j int) redis.Z {
	return redis.Z{Score: float64(t), Member: fmt.Sprintf("%d-%d", t, j)}
}
