package checker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// leaseEndpoint is an endpoint of the test's own: a global rule's bucket is one key for every
// check, so tests sharing the package's Redis (and -count repetitions) keep apart by endpoint.
func leaseEndpoint(t *testing.T) string {
	return fmt.Sprintf("/lease/%s/%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), time.Now().UnixNano())
}

// leasedRules is a global fixed_window rule of limit and slice at endpoint, and a per-user rule
// of userLimit on the same endpoint.
func leasedRules(endpoint string, limit, slice, userLimit int) string {
	return fmt.Sprintf(`rules:
  - {id: hot, dimension: global, endpoint: %q, algorithm: fixed_window, limit: %d, window: 1h, lease: {slice: %d}}
  - {id: per-user, dimension: user, endpoint: %q, algorithm: fixed_window, limit: %d, window: 1h}
`, endpoint, limit, slice, endpoint, userLimit)
}

// countingSink counts the decisions published, by result.
type countingSink struct{ allowed, denied atomic.Int64 }

func (s *countingSink) Publish(_ string, _ *Query, out *Outcome) {
	if out.Allowed {
		s.allowed.Add(1)
	} else {
		s.denied.Add(1)
	}
}

// windowKey is the Redis key of the hot rule's bucket.
func windowKey(endpoint string) string { return "rl:{global}:fw:1h:" + endpoint }

// sameWindow fails the test's numbers only within one window: it skips when the hour turned
// between the first and last of resets (a allotted rule's windows are aligned to the hour).
func sameWindow(t *testing.T, resets *sync.Map) {
	t.Helper()
	n := 0
	resets.Range(func(any, any) bool { n++; return true })
	if n > 1 {
		t.Skipf("the window turned during the test (%d windows)", n)
	}
}

// TestLeasedExact: three engines, each with its own store, share a allotted global rule; far more
// concurrent checks than the limit, spread over them, admit exactly the limit, every decision
// is published, and each check's units are allotted from Redis once: the window's counter is the
// limit. A checker holds what it allotted until its own checks use it, so with enough checks on
// every engine none is left unused.
func TestLeasedExact(t *testing.T) {
	t.Parallel()
	const limit, slice = 1000, 64
	ep := leaseEndpoint(t)
	tests := []struct {
		name string
		cost int64
	}{
		{"cost 1", 1},
		{"cost 3", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := ep + "/" + strings.ReplaceAll(tt.name, " ", "")
			set := mustRules(t, leasedRules(ep, limit, slice, 1_000_000))
			sinks := make([]*countingSink, 3)
			engines := make([]*Engine, 3)
			for i := range engines {
				sinks[i] = &countingSink{}
				engines[i] = newEngine(t, Config{Rules: set, Decisions: sinks[i]})
			}
			checks := 3 * limit / int(tt.cost)
			var allowed, failed atomic.Int64
			var resets sync.Map
			var wg sync.WaitGroup
			for w := range 24 {
				wg.Go(func() {
					e := engines[w%3]
					for i := w; i < checks; i += 24 {
						q := userQuery(fmt.Sprintf("u%d", i%50), ep)
						q.Cost = tt.cost
						out, err := e.Check(context.Background(), q)
						if err != nil || out.Degraded {
							failed.Add(1)
							continue
						}
						if out.Allowed {
							allowed.Add(tt.cost)
							resets.Store(out.Limits[0].Result.ResetAt.Unix(), true)
						}
					}
				})
			}
			wg.Wait()
			sameWindow(t, &resets)
			if n := failed.Load(); n > 0 {
				t.Fatalf("%d checks failed or were degraded", n)
			}
			// A partial grant can leave an engine fewer units than a cost: at most cost-1 each.
			if got, least := allowed.Load(), int64(limit)-3*(tt.cost-1); got > limit || got < least {
				t.Errorf("%d checks of cost %d over 3 engines admitted %d units, want %d to %d", checks, tt.cost, got, least, limit)
			}
			var published, publishedAllowed int64
			for _, s := range sinks {
				published += s.allowed.Load() + s.denied.Load()
				publishedAllowed += s.allowed.Load()
			}
			if published != int64(checks) || publishedAllowed*tt.cost != allowed.Load() {
				t.Errorf("published %d decisions (%d allowed), want %d (%d allowed)", published, publishedAllowed, checks, allowed.Load()/tt.cost)
			}
			rdb := redisSrv.UniversalClient()
			defer rdb.Close()
			n, err := rdb.HGet(context.Background(), windowKey(ep), "n").Int64()
			if err != nil {
				t.Fatal(err)
			}
			if n > limit || n < allowed.Load() {
				t.Errorf("the window's counter is %d, want from the %d admitted to the limit %d", n, allowed.Load(), limit)
			}
		})
	}
}

// TestLeasedAllOrNothing: a check denied by another limit gives its allotted units back to the
// slice, so they admit other checks: a user allowed 5 of 40 checks costs the allotted rule 5
// units, and other users then get exactly the rest of its limit.
func TestLeasedAllOrNothing(t *testing.T) {
	t.Parallel()
	const limit, slice, userLimit = 100, 10, 5
	ep := leaseEndpoint(t)
	e := newEngine(t, Config{Rules: mustRules(t, leasedRules(ep, limit, slice, userLimit))})
	ctx := context.Background()
	count := func(user string, n int) (allowed int) {
		for range n {
			out, err := e.Check(ctx, userQuery(user, ep))
			if err != nil {
				t.Fatal(err)
			}
			if out.Allowed {
				allowed++
			}
		}
		return allowed
	}
	if got := count("greedy", 40); got != userLimit {
		t.Fatalf("user limited to %d: got %d of 40 allowed", userLimit, got)
	}
	total := userLimit
	for u := range 40 {
		total += count(fmt.Sprintf("other-%d", u), userLimit)
	}
	if total != limit {
		t.Errorf("admitted %d in all, want exactly the leased rule's limit %d (units of denied checks given back)", total, limit)
	}
	out, err := e.Check(ctx, userQuery("late", ep))
	if err != nil {
		t.Fatal(err)
	}
	d := out.DecidingLimit()
	if out.Allowed || d == nil || d.Rule.ID != "hot" || d.Result.RetryAfter <= 0 || d.Result.Remaining != 0 {
		t.Errorf("check past the limit: got allowed %v, deciding %+v; want denied by hot with a retry", out.Allowed, d)
	}
}

// TestLeasedLimitLowered: a limit lowered mid-window counts what was allotted before it and no
// more: the first check under the new rules gives the old slice's unused units back before it
// allotments under the new limit. Also when a check saw the new limit before SetRules did (an
// override expiring by the clock is seen by Effective before the rule store rebuilds the set):
// that check finds the window spent, and the first check after SetRules gives the old slice
// back and asks again.
func TestLeasedLimitLowered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		swap func(e *Engine, set *rules.Set)
	}{
		{"rule change", func(e *Engine, set *rules.Set) { e.SetRules(set) }},
		{"limit seen before the rule change", func(e *Engine, set *rules.Set) {
			e.rules.Store(set)
			if _, err := e.Check(context.Background(), userQuery("gap", set.Rules()[0].Endpoint)); err != nil {
				t.Fatal(err)
			}
			e.SetRules(set)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ep := leaseEndpoint(t)
			e := newEngine(t, Config{Rules: mustRules(t, leasedRules(ep, 1000, 100, 1_000_000))})
			ctx := context.Background()
			for range 10 {
				if out, err := e.Check(ctx, userQuery("u", ep)); err != nil || !out.Allowed {
					t.Fatalf("check under the limit: %v, %v", out, err)
				}
			}
			tt.swap(e, mustRules(t, leasedRules(ep, 50, 20, 1_000_000)))
			allowed := 0
			for range 100 {
				out, err := e.Check(ctx, userQuery("u", ep))
				if err != nil {
					t.Fatal(err)
				}
				if out.Allowed {
					allowed++
				}
			}
			if allowed != 40 {
				t.Errorf("after lowering the limit to 50 with 10 admitted: %d more allowed, want 40", allowed)
			}
		})
	}
}

// TestLeasedBypass: peeks and checks with an idempotency key are not allotted: they go to Redis,
// whose counter the allotments share, and a retried check replays.
func TestLeasedBypass(t *testing.T) {
	t.Parallel()
	ep := leaseEndpoint(t)
	e := newEngine(t, Config{Rules: mustRules(t, leasedRules(ep, 100, 10, 1_000_000))})
	ctx := context.Background()
	if out, err := e.Check(ctx, userQuery("u", ep)); err != nil || !out.Allowed {
		t.Fatalf("first check: %v, %v", out, err)
	}
	out, err := e.Peek(ctx, userQuery("u", ep))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range out.Limits {
		if got := l.Result.Used; l.Rule.ID == "hot" && got != 10 {
			t.Errorf("peek: got used %d of hot, want the leased slice, 10", got)
		}
	}
	q := userQuery("u", ep)
	q.IdempotencyKey = "retry-" + ep
	first, err := e.Check(ctx, q)
	if err != nil || !first.Allowed || first.Replayed {
		t.Fatalf("check with a key: %+v, %v", first, err)
	}
	again, err := e.Check(ctx, q)
	if err != nil || !again.Allowed || !again.Replayed {
		t.Fatalf("retry: got %+v, %v; want allowed and replayed", again, err)
	}
	rdb := redisSrv.UniversalClient()
	defer rdb.Close()
	if n, err := rdb.HGet(ctx, windowKey(ep), "n").Int64(); err != nil || n != 11 {
		t.Errorf("counter after a slice and a keyed check and its replay: got %d, %v; want 11", n, err)
	}
}

// TestLeasedUnavailable: a allotted rule whose slice cannot be allotted (Redis stopped) is decided
// by its fail mode like any other, and flagged degraded.
func TestLeasedUnavailable(t *testing.T) {
	t.Parallel()
	ep := leaseEndpoint(t)
	srv, stop := stalledRedis(t)
	rdb := srv.Client(0)
	t.Cleanup(func() { rdb.Close() })
	doc := fmt.Sprintf(`rules:
  - {id: open, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 1000, window: 1h, lease: {slice: 10}}
  - {id: closed, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 1000, window: 1h, lease: {slice: 10}, fail_mode: closed}
`, ep+"/open", ep+"/closed")
	e := newEngine(t, Config{Redis: rdb, Rules: mustRules(t, doc), RedisTimeout: 100 * time.Millisecond})
	stop()
	tests := []struct {
		endpoint    string
		wantAllowed bool
	}{
		{ep + "/open", true},
		{ep + "/closed", false},
	}
	for _, tt := range tests {
		out, err := e.Check(context.Background(), userQuery("u", tt.endpoint))
		if err != nil {
			t.Fatal(err)
		}
		if out.Allowed != tt.wantAllowed || !out.Degraded {
			t.Errorf("%s with Redis stalled: got allowed %v degraded %v, want allowed %v degraded", tt.endpoint, out.Allowed, out.Degraded, tt.wantAllowed)
		}
	}
}

// TestLeasedWindows: across many short windows, three engines on a allotted rule never admit
// more than the limit in any window of Redis's clock. In even windows each engine decides one
// check, and so holds most of a slice when the window ends; odd windows are spent by many
// checks. A check is counted in a window only when it was sent and answered within it (this
// machine's clock is Redis's), so that its decision surely fell in it: a slice used past its
// window's end would admit its leftover units on top of the next window's limit.
func TestLeasedWindows(t *testing.T) {
	t.Parallel()
	const limit, slice = 50, 16
	const window = 100 * time.Millisecond
	ep := leaseEndpoint(t)
	doc := fmt.Sprintf(`rules:
  - {id: hot, dimension: global, endpoint: %q, algorithm: fixed_window, limit: %d, window: 100ms, lease: {slice: %d}}
`, ep, limit, slice)
	set := mustRules(t, doc)
	engines := make([]*Engine, 3)
	for i := range engines {
		engines[i] = newEngine(t, Config{Rules: set})
	}
	wid := func() int64 { return time.Now().UnixMicro() / window.Microseconds() }
	var mu sync.Mutex
	within := map[int64]int{} // odd window id -> checks admitted surely within it
	end := wid() + 20
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Go(func() {
			e := engines[w%3]
			var quiet int64 = -1 // the last even window this worker checked in
			for {
				sent := wid()
				if sent >= end {
					return
				}
				if sent%2 == 0 {
					if w < 3 && quiet != sent {
						quiet = sent
					} else {
						// Pacing, not an assertion: wait for the odd window.
						time.Sleep(time.Until(time.UnixMicro((sent + 1) * window.Microseconds())))
						continue
					}
				}
				out, err := e.Check(context.Background(), userQuery("u", ep))
				got := wid()
				if err != nil || out.Degraded {
					t.Errorf("check: %v, degraded %v", err, out != nil && out.Degraded)
					return
				}
				if out.Allowed && sent == got && got%2 == 1 {
					mu.Lock()
					within[got]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	full := 0
	for wid, n := range within {
		if n > limit {
			t.Errorf("window %d: %d checks admitted within it, more than the limit %d", wid, n, limit)
		}
		if n >= limit-3*slice {
			full++
		}
	}
	// The test means something only if odd windows were spent (500 checks/s do it).
	if full < 3 {
		t.Skipf("only %d of %d windows had their limit nearly admitted (%v): too slow a machine to spend them", full, len(within), within)
	}
}

// TestLeasedReset: a reset of a allotted rule drops this checker's slice with the bucket: the
// window then admits its limit afresh, not the limit plus what the old slice held.
func TestLeasedReset(t *testing.T) {
	t.Parallel()
	const limit = 200
	ep := leaseEndpoint(t)
	e := newEngine(t, Config{Rules: mustRules(t, leasedRules(ep, limit, 50, 1_000_000))})
	ctx := context.Background()
	admit := func(n int) (allowed int) {
		for range n {
			out, err := e.Check(ctx, userQuery("u", ep))
			if err != nil {
				t.Fatal(err)
			}
			if out.Allowed {
				allowed++
			}
		}
		return allowed
	}
	if got := admit(10); got != 10 {
		t.Fatalf("before the reset: %d of 10 allowed", got)
	}
	if _, ids, err := e.Reset(ctx, ResetRequest{Subject: globalSubject, RuleID: "hot"}); err != nil || len(ids) != 1 {
		t.Fatalf("reset: %v, %v", ids, err)
	}
	if got := admit(2 * limit); got != limit {
		t.Errorf("after the reset: %d allowed, want the limit %d (the old slice dropped)", got, limit)
	}
}

// counterSum is the sum of counter name's data points in r.
func counterSum(t *testing.T, r *sdkmetric.ManualReader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// TestLeasedShadowAndMetrics: a shadow allotted rule reports its denial without denying, and
// checks decided from slices are counted with the units allotted.
func TestLeasedShadowAndMetrics(t *testing.T) {
	t.Parallel()
	ep := leaseEndpoint(t)
	doc := fmt.Sprintf(`rules:
  - {id: hot-shadow, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 5, window: 1h, shadow: true, lease: {slice: 2}}
`, ep)
	reader := sdkmetric.NewManualReader()
	e := newEngine(t, Config{Rules: mustRules(t, doc), Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")})
	shadowDenied := 0
	for range 8 {
		out, err := e.Check(context.Background(), userQuery("u", ep))
		if err != nil {
			t.Fatal(err)
		}
		if !out.Allowed {
			t.Fatalf("a shadow rule denied a check: %+v", out)
		}
		if len(out.Limits) != 1 || out.Limits[0].Rule.ID != "hot-shadow" {
			t.Fatalf("limits: got %+v, want hot-shadow's alone", out.Limits)
		}
		if !out.Limits[0].Result.Allowed {
			shadowDenied++
		}
	}
	if shadowDenied != 3 {
		t.Errorf("shadow limit of 5: %d of 8 checks reported denied, want 3", shadowDenied)
	}
	tests := []struct {
		metric string
		want   int64
	}{
		{"quotaflow.checks.leased", 8},
		{"quotaflow.lease.units", 5},
	}
	for _, tt := range tests {
		if got := counterSum(t, reader, tt.metric); got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.metric, got, tt.want)
		}
	}
}

// TestLeasedCloseGivesBack: an engine that closes gives its unused units back, and a rule
// change that leaves a key's limit as it was keeps its slice (no allotment call for it).
func TestLeasedCloseGivesBack(t *testing.T) {
	t.Parallel()
	ep := leaseEndpoint(t)
	e := newEngine(t, Config{Rules: mustRules(t, leasedRules(ep, 1000, 100, 1_000_000))})
	ctx := context.Background()
	rdb := redisSrv.UniversalClient()
	defer rdb.Close()
	counter := func() int64 {
		n, err := rdb.HGet(ctx, windowKey(ep), "n").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for range 10 {
		if out, err := e.Check(ctx, userQuery("u", ep)); err != nil || !out.Allowed {
			t.Fatalf("check: %v, %v", out, err)
		}
	}
	e.SetRules(mustRules(t, leasedRules(ep, 1000, 100, 5)))
	for range 5 {
		if out, err := e.Check(ctx, userQuery("v", ep)); err != nil || !out.Allowed {
			t.Fatalf("check after the rule change: %v, %v", out, err)
		}
	}
	if got := counter(); got != 100 {
		t.Errorf("counter after a rule change keeping the limit: got %d, want the one slice of 100", got)
	}
	e.Close()
	if got := counter(); got != 15 {
		t.Errorf("counter after Close: got %d, want the 15 used", got)
	}
}

// TestLeasedTierLimits: a tier multiplier gives one global key two limits at once, one per
// tier; each keeps its own slice, so checks alternating between the tiers allotment one slice
// each instead of evicting each other's at every check.
func TestLeasedTierLimits(t *testing.T) {
	t.Parallel()
	ep := leaseEndpoint(t)
	doc := fmt.Sprintf(`default_tier: free
tiers: {free: {}, premium: {}}
rules:
  - {id: hot, dimension: global, endpoint: %q, algorithm: fixed_window, limit: 1000, window: 1h, lease: {slice: 100}}
`, ep)
	now := time.Now()
	set := mustRules(t, doc).WithOverrides([]rules.Override{{ID: "half", Tier: "free", Multiplier: 0.5, Reason: "test", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}})
	reader := sdkmetric.NewManualReader()
	e := newEngine(t, Config{Rules: set, Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")})
	limits := map[string]int64{}
	for i := range 100 {
		q := userQuery("u", ep)
		q.Tier = []string{"free", "premium"}[i%2]
		out, err := e.Check(context.Background(), q)
		if err != nil || !out.Allowed {
			t.Fatalf("check %d: %+v, %v", i, out, err)
		}
		limits[q.Tier] = out.Limits[0].Limit.Limit
	}
	if limits["free"] != 500 || limits["premium"] != 1000 {
		t.Fatalf("effective limits: got %v, want free 500, premium 1000", limits)
	}
	tests := []struct {
		metric string
		want   int64
	}{
		{"quotaflow.lease.units", 200},
		{"quotaflow.lease.returned", 0},
	}
	for _, tt := range tests {
		if got := counterSum(t, reader, tt.metric); got != tt.want {
			t.Errorf("%s after 100 checks alternating between two tiers: got %d, want %d", tt.metric, got, tt.want)
		}
	}
}

// TestLeasedWithKeyedChecks: checks with an idempotency key, charged in Redis on the counter the
// slices are allotted from, mixed with allotted ones over three engines, admit exactly the limit:
// a keyed check denied once the window is spent must not keep the other checks from the units
// an engine still holds (the over-limit cache does not remember allotted rules' denials).
func TestLeasedWithKeyedChecks(t *testing.T) {
	t.Parallel()
	const limit, slice = 1000, 64
	ep := leaseEndpoint(t)
	set := mustRules(t, leasedRules(ep, limit, slice, 1_000_000))
	engines := make([]*Engine, 3)
	for i := range engines {
		engines[i] = newEngine(t, Config{Rules: set})
	}
	var allowed, failed atomic.Int64
	var resets sync.Map
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Go(func() {
			e := engines[w%3]
			for i := w; i < 3*limit; i += 24 {
				q := userQuery(fmt.Sprintf("u%d", i%50), ep)
				if i%7 == 0 {
					q.IdempotencyKey = fmt.Sprintf("k-%s-%d", ep, i)
				}
				out, err := e.Check(context.Background(), q)
				if err != nil || out.Degraded {
					failed.Add(1)
					continue
				}
				if out.Allowed {
					allowed.Add(1)
					resets.Store(out.Limits[0].Result.ResetAt.Unix(), true)
				}
			}
		})
	}
	wg.Wait()
	sameWindow(t, &resets)
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d checks failed or were degraded", n)
	}
	if got := allowed.Load(); got != limit {
		t.Errorf("%d checks, a seventh with an idempotency key, admitted %d, want exactly %d", 3*limit, got, limit)
	}
}
