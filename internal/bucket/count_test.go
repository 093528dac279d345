package bucket

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestStoreCount runs counted requests (Request.Count), Envoy's reference semantics: every hit
// is counted, allowed or not, and a check is over the limit when the count after it is past
// the limit; a limit of 0 denies every hit. Both layouts, on every Redis the suite runs on, and
// Local, the scripts' twin, which backtests replay counted rules with.
func TestStoreCount(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	tests := []struct {
		name  string
		limit int64
		costs []int64
		want  []bool  // allowed, per check
		used  []int64 // the count the reply reports: after an allowed check, before a denied one
	}{
		{"under then over", 2, []int64{1, 1, 1, 1}, []bool{true, true, false, false}, []int64{1, 2, 2, 3}},
		// A denied hit of 3 is counted: the next hit of 1 is over too, where an uncounted
		// window would still allow it.
		{"big hit counted", 5, []int64{4, 3, 1}, []bool{true, false, false}, []int64{4, 4, 7}},
		{"zero limit", 0, []int64{1, 1}, []bool{false, false}, []int64{0, 1}},
	}
	for _, c := range twins(s, time.Microsecond) {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				testCount(t, func(req Request) Result { return c.one(t, req) }, tt.limit, tt.costs, tt.want, tt.used)
			})
		}
	}
}

// testCount runs counted checks of costs against a fixed window of limit through check: want
// and used are each check's answer and reported count; every hit ends up counted.
func testCount(t *testing.T, check func(Request) Result, limit int64, costs []int64, want []bool, used []int64) {
	t.Helper()
	l := lim(key(t, "c"), algorithm.FixedWindow, limit, time.Hour, 0)
	var sum int64
	for i, cost := range costs {
		req := one(l, cost)
		req.Count = true
		res := check(req)
		if res.Allowed != want[i] || res.Limits[0].Used != used[i] {
			t.Errorf("check %d (cost %d): got allowed %v used %d, want %v %d", i, cost, res.Allowed, res.Limits[0].Used, want[i], used[i])
		}
		sum += cost
	}
	if res := check(peekReq(l)); res.Limits[0].Used != sum {
		t.Errorf("after the checks: got used %d, want every hit counted, %d", res.Limits[0].Used, sum)
	}
}

// TestCountRefused: a counted request of another algorithm or with an idempotency record is
// refused before anything is sent; a zero limit is a fixed window's alone.
func TestCountRefused(t *testing.T) {
	t.Parallel()
	k := "rl:{user:count}:x"
	tests := []struct {
		name string
		req  Request
	}{
		{"token bucket counted", Request{Cost: 1, Count: true, Limits: []Limit{lim(k, algorithm.TokenBucket, 5, time.Second, 5)}}},
		{"counted with a record", Request{Cost: 1, Count: true, IdempotencyKey: k + ":i", Limits: []Limit{lim(k, algorithm.FixedWindow, 5, time.Second, 0)}}},
		{"zero token bucket", Request{Cost: 1, Limits: []Limit{lim(k, algorithm.TokenBucket, 0, time.Second, 0)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.req.Validate(); !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("got %v, want ErrInvalidRequest", err)
			}
		})
	}
}
