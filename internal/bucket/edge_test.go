package bucket

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestStoreClockBack writes states stamped an hour ahead of Redis time, as a clock stepping
// back would leave them: no algorithm may refill from them.
func TestStoreClockBack(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	const L, W = 5, 100 * time.Millisecond
	wus := W.Microseconds()
	ahead := c.Time(ctx).Val().Add(time.Hour).UnixMicro()
	wid := ahead / wus
	str := func(v int64) string { return strconv.FormatInt(v, 10) }
	tests := []struct {
		alg   Algorithm
		write func(k string) error
	}{
		{TokenBucket, func(k string) error { return c.HSet(ctx, k, "tk", "0", "ts", str(ahead), "cap", str(L)).Err() }},
		{LeakyBucket, func(k string) error { return c.HSet(ctx, k, "lv", str(L), "ts", str(ahead)).Err() }},
		{FixedWindow, func(k string) error { return c.HSet(ctx, k, "w", str(wid), "n", str(L)).Err() }},
		{SlidingWindowCounter, func(k string) error { return c.HSet(ctx, k, "w", str(wid), "c", str(L), "p", "0").Err() }},
		{SlidingWindowLog, func(k string) error {
			for j := 1; j <= L; j++ {
				if err := c.ZAdd(ctx, k, zmember(ahead, j)).Err(); err != nil {
					return err
				}
			}
			return nil
		}},
		{GCRA, func(k string) error { return c.Set(ctx, k, str(ahead), 0).Err() }},
	}
	for _, tt := range tests {
		t.Run(tt.alg.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), tt.alg, L, W, 0)
			if err := tt.write(l.Key); err != nil {
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

// TestStoreSlidingLogMembers: charges landing on a µs that already has members (a clock that
// stepped back) get fresh member names, and a refund removes exactly its own members, also
// for costs above the script's batch size.
func TestStoreSlidingLogMembers(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	ahead := c.Time(ctx).Val().Add(time.Minute).UnixMicro()
	tests := []struct {
		name     string
		existing []int // member suffixes already at the newest µs
		cost     int64
	}{
		{"free_names", nil, 3},
		{"taken_after", []int{1, 3}, 3},
		{"taken_between", []int{1, 4}, 3},
		{"large_cost", []int{2}, 1234},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), SlidingWindowLog, 5000, time.Hour, 0)
			for _, j := range tt.existing {
				c.ZAdd(ctx, l.Key, zmember(ahead, j))
			}
			if len(tt.existing) == 0 {
				c.ZAdd(ctx, l.Key, zmember(ahead, 1000)) // only stamps the µs
			}
			before := c.ZCard(ctx, l.Key).Val()
			deny := lim(key(t, "deny"), FixedWindow, 1, long, 0)
			check(t, s, one(deny, 1))

			res, err := s.Check(ctx, []Request{one(l, tt.cost)})
			if err != nil || !res[0].Allowed {
				t.Fatalf("charge: got %+v, %v, want allowed", res, err)
			}
			if got := c.ZCard(ctx, l.Key).Val(); got != before+tt.cost {
				t.Errorf("after a charge of %d: %d members, want %d (names collided)", tt.cost, got, before+tt.cost)
			}
			res, err = s.Check(ctx, []Request{one(l, tt.cost), one(deny, 1)})
			if err != nil || !res[0].Refunded {
				t.Fatalf("charge and refund: got %+v, %v, want refunded", res, err)
			}
			if got := c.ZCard(ctx, l.Key).Val(); got != before+tt.cost {
				t.Errorf("after a refunded charge: %d members, want %d", got, before+tt.cost)
			}
			for _, j := range tt.existing {
				if err := c.ZScore(ctx, l.Key, fmt.Sprintf("%d-%d", ahead, j)).Err(); err != nil {
					t.Errorf("member %d-%d that was there before: %v", ahead, j, err)
				}
			}
		})
	}
}

func zmember(t int64, j int) redis.Z {
	return redis.Z{Score: float64(t), Member: fmt.Sprintf("%d-%d", t, j)}
}
