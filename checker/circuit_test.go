package checker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestCircuit: only threshold failures in a row, spanning the circuit's span, open it; a
// success in between starts the count again.
func TestCircuit(t *testing.T) {
	t.Parallel()
	fail := errors.New("connection refused")
	const span = 50 * time.Millisecond
	tests := []struct {
		name      string
		threshold int
		outcomes  string // f: a failure, s: a success, +: span passes
		want      bool
	}{
		{"one failure", 0, "f", false},
		{"two failures", 0, "f+f", false},
		{"three failures over the span, the default", 0, "ff+f", true},
		{"three failures at once (a starved burst)", 0, "ffff", false},
		{"a burst, then the next round succeeds", 0, "ffffs+f", false},
		{"a success between", 0, "ff+sff", false},
		{"failures after a success", 0, "ffs+f+ff", true},
		{"threshold 5", 5, "ff+ff", false},
		{"threshold 5 reached", 5, "ff+fff", true},
		{"successes only", 0, "ss+sss", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opened := 0
			c := newCircuit(tt.threshold, span, func(error) { opened++ })
			clock := time.Unix(1e9, 0)
			c.now = func() time.Time { return clock }
			for _, o := range tt.outcomes {
				switch o {
				case 'f':
					c.record(fail)
				case 's':
					c.record(nil)
				case '+':
					clock = clock.Add(span)
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

func (s faultyStore) Send(ctx context.Context, reqs []bucket.Request) bucket.Pending {
	return bucket.Done(s.check(ctx, reqs))
}

func (s faultyStore) check(ctx context.Context, reqs []bucket.Request) ([]bucket.Result, error) {
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
	e := newEngine(t, Config{store: faultyStore{store}, Rules: checkertest.Rules(t, `
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

// TestBurstKeepsCircuitClosed: a burst of concurrent checks starves the checker of CPU on two
// cores, so the batch loops' round trips may all time out at once, though Redis answered them
// in time. Such checks are decided by their fail mode, each on its own; the circuit stays
// closed, and no check is allowed past the limit by Redis. Before, the burst's timeouts opened
// the circuit, and every check after them was decided by fail mode (open: allowed).
func TestBurstKeepsCircuitClosed(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{RedisTimeout: 50 * time.Millisecond, ProbeInterval: time.Hour, Rules: checkertest.Rules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: burst, dimension: user, endpoint: /burst, algorithm: fixed_window, limit: 100, window: 1h}
`)})
	query := func(user string) *Query {
		return &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, user)}}, Endpoint: "/burst", Cost: 1}
	}
	const checks = 3000
	var allowed, degraded, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range checks {
		wg.Go(func() {
			<-start
			got, err := e.Check(context.Background(), query("u"))
			switch {
			case err != nil:
				failed.Add(1)
			case got.Degraded:
				degraded.Add(1)
			case got.Allowed:
				allowed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d concurrent checks: %d allowed by Redis, %d decided by fail mode", checks, allowed.Load(), degraded.Load())
	if allowed.Load() > 100 || failed.Load() != 0 {
		t.Errorf("%d concurrent checks: %d allowed by Redis, %d failed; want at most 100 allowed, none failed", checks, allowed.Load(), failed.Load())
	}
	if e.guard.circuit.open() {
		t.Error("the circuit opened during a burst, with Redis answering")
	}
	// Redis may still be working through the burst's calls (each batch runs for up to a
	// second whoever waits for it), so a check right after it can still miss its 50 ms: the
	// circuit being closed, one gets an exact answer as soon as Redis is through; an open one
	// (probing every hour here) would answer every check by its fail mode.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := e.Check(context.Background(), query("after"))
		if err == nil && !got.Degraded && got.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("checks for 5s after the burst: last %+v, %v; want an exact allow", got, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConcurrentQueryEndpoint: one Query whose endpoint is not in normal form, checked from
// many goroutines at once (run it under -race): the engine matches the normal form without
// writing it into the caller's Query.
func TestConcurrentQueryEndpoint(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: search, dimension: user, endpoint: /api/v1/search, algorithm: fixed_window, limit: 8, window: 1h}
`)})
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}, Endpoint: "/API/v1//search/", Cost: 1}
	allowed := checkConcurrently(t, e, q, 16)
	if allowed != 8 || q.Endpoint != "/API/v1//search/" {
		t.Errorf("16 checks of /API/v1//search/: %d allowed, query's endpoint now %q; want 8 (the search rule's limit), unchanged", allowed, q.Endpoint)
	}
}

// TestConcurrentQuerySubjects: one Query whose subjects slice has spare capacity, as the
// transports build them, checked from many goroutines at once (run it under -race): the engine plans the
// global subject without appending it to the caller's slice, so the checks share nothing they
// write, the global rule counts each check once, and the spare capacity stays untouched.
func TestConcurrentQuerySubjects(t *testing.T) {
	t.Parallel()
	// The global bucket is named by the rule's endpoint: one of this run's own.
	id := strings.ToLower(checkertest.ID(t, "u"))
	e := newEngine(t, Config{Rules: checkertest.Rules(t, fmt.Sprintf(`
default_tier: free
tiers: {free: {}}
rules:
  - {id: user, dimension: user, endpoint: /api/v1/search/%[1]s, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: everyone, dimension: global, endpoint: /api/v1/search/%[1]s, algorithm: fixed_window, limit: 8, window: 1h}
`, id))})
	q := &Query{Subjects: append(make([]Subject, 0, 3), Subject{Dimension: rules.DimensionUser, ID: id}), Endpoint: "/api/v1/search/" + id}
	allowed := checkConcurrently(t, e, q, 16)
	if got := q.Subjects[:cap(q.Subjects)][1]; allowed != 8 || len(q.Subjects) != 1 || !reflect.DeepEqual(got, Subject{}) {
		t.Errorf("16 checks: %d allowed, query's subjects %v, spare slot %v; want 8 (the global rule's limit), one subject, the zero Subject",
			allowed, q.Subjects, got)
	}
}

// checkConcurrently checks q from n goroutines at once and returns how many were allowed.
func checkConcurrently(t *testing.T, e *Engine, q *Query, n int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			out, err := e.Check(context.Background(), q)
			if err != nil {
				t.Error(err)
				return
			}
			if out.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	return allowed.Load()
}

// passedDeadline is a context whose deadline has passed while its timer has not yet fired:
// what a check sees when Redis's socket deadline, set from the same instant, fires first.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Microsecond), true }

// TestCallerErr: a caller whose context ended, or whose deadline has passed before its timer
// fired, is gone with a non-nil error that says so; a live caller is not gone.
func TestCallerErr(t *testing.T) {
	t.Parallel()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	live, stop := context.WithTimeout(context.Background(), time.Hour)
	defer stop()
	tests := []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"live", live, nil},
		{"no deadline", context.Background(), nil},
		{"canceled", canceled, context.Canceled},
		{"deadline passed, timer not fired", passedDeadline{context.Background()}, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := callerErr(tt.ctx)
			if !errors.Is(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("callerErr = %v, want %v", got, tt.want)
			}
			if gone := callerGone(tt.ctx); gone != (tt.want != nil) {
				t.Errorf("callerGone = %v, want %v", gone, tt.want != nil)
			}
		})
	}
}
