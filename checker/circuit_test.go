package checker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/checkertest"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// TestCircuit: only threshold failures in a row open the circuit; a success in between starts
// the count again.
func TestCircuit(t *testing.T) {
	t.Parallel()
	fail := errors.New("connection refused")
	tests := []struct {
		name      string
		threshold int
		outcomes  string // f: a failure, s: a success
		want      bool
	}{
		{"one failure", 0, "f", false},
		{"two failures", 0, "ff", false},
		{"three failures, the default", 0, "fff", true},
		{"a success between", 0, "ffsff", false},
		{"failures after a success", 0, "ffsfff", true},
		{"threshold 5", 5, "ffff", false},
		{"threshold 5 reached", 5, "fffff", true},
		{"successes only", 0, "sssss", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opened := 0
			c := newCircuit(tt.threshold, func(error) { opened++ })
			for _, o := range tt.outcomes {
				if o == 'f' {
					c.record(fail)
				} else {
					c.record(nil)
				}
			}
			if got := c.open(); got != tt.want {
				t.Errorf("after %q: open %v, want %v", tt.outcomes, got, tt.want)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.want]; opened != want {
				t.Errorf("after %q: opened %d times, want %d", tt.outcomes, opened, want)
			}
			c.close()
			if c.open() {
				t.Error("open after close")
			}
		})
	}
}

// faultyStore is the real bucket.Store, but answers the checks of subjects whose identifier
// contains "malformed" with a malformed reply, and blocks the checks of "stall" until their
// context ends: the two things a caller can provoke that are not Redis failing.
type faultyStore struct{ *bucket.Store }

func (s faultyStore) Check(ctx context.Context, reqs []bucket.Request) ([]bucket.Result, error) {
	for i, r := range reqs {
		for _, l := range r.Limits {
			switch {
			case strings.Contains(l.Key, "malformed"):
				return nil, fmt.Errorf("bucket: request %d: %w", i, bucket.ErrMalformedReply)
			case strings.Contains(l.Key, "stall"):
				<-ctx.Done()
				return nil, fmt.Errorf("bucket: %w", ctx.Err())
			}
		}
	}
	return s.Store.Check(ctx, reqs)
}

// TestGuardCountsOnlyStoreFailures: a malformed reply fails its own check, logged by the
// transport, and never degrades anyone (before, it opened the circuit and fail_mode closed
// rules refused everyone); callers giving up early do not open it either, whether the store
// reports its round trips (bucket.Store, TestDeadlineAttack) or the guard judges a store passed
// in by the errors it returns (here).
func TestGuardCountsOnlyStoreFailures(t *testing.T) {
	t.Parallel()
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	store := bucket.NewStore(rdb)
	t.Cleanup(func() { store.Close() })
	e := newEngine(t, Config{Store: faultyStore{store}, Rules: checkertest.Rules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: closed, dimension: user, endpoint: /closed, algorithm: fixed_window, limit: 1000, window: 1h, fail_mode: closed}
`)})
	query := func(user string) *Query {
		return &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, user)}}, Endpoint: "/closed", Cost: 1}
	}
	ctx := context.Background()
	for i := range 10 {
		got, err := e.Check(ctx, query("malformed"))
		if !errors.Is(err, bucket.ErrMalformedReply) || got != nil {
			t.Fatalf("malformed check %d: %+v, %v; want an error wrapping ErrMalformedReply", i, got, err)
		}
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			defer cancel()
			if _, err := e.Check(cctx, query("stall")); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("check cut short by its caller: %v, want context.DeadlineExceeded", err)
			}
		})
	}
	wg.Wait()
	if got, err := e.Check(ctx, query("bystander")); err != nil || !got.Allowed || got.Degraded {
		t.Errorf("bystander under fail_mode closed: %+v, %v; want an exact allow", got, err)
	}
	if err := e.Ready(ctx); err != nil {
		t.Errorf("Ready: %v, want nil: nothing failed in Redis", err)
	}
}
