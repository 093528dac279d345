package transport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

func checkReq(user, endpoint string) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
	return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint,
	})
}

func mustCheck(t *testing.T, c quotaflowv1connect.RateLimiterClient, req *connect.Request[quotaflowv1.CheckRateLimitRequest]) *quotaflowv1.CheckRateLimitResponse {
	t.Helper()
	resp, err := c.CheckRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("CheckRateLimit: %v", err)
	}
	return resp.Msg
}

// TestProtocols checks a limit until denied over each protocol on the one port.
func TestProtocols(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := env.client(protocol)
			user := id(t, "u")
			for i := 1; i <= 5; i++ {
				got := mustCheck(t, c, checkReq(user, "/orders"))
				if !got.Allowed || got.Remaining != int64(5-i) || got.CurrentCount != int64(i) || got.Limit != 5 || got.RuleId != "user-orders" {
					t.Fatalf("check %d = allowed %v remaining %d count %d limit %d rule %q, want allowed, %d left, count %d, limit 5, user-orders",
						i, got.Allowed, got.Remaining, got.CurrentCount, got.Limit, got.RuleId, 5-i, i)
				}
				// Warning once more than 80% of the limit is used (the default enter ratio, the
				// aggregator's test too): 5 of 5, not 4 of 5.
				wantState := quotaflowv1.State_STATE_NORMAL
				if i >= 5 {
					wantState = quotaflowv1.State_STATE_WARNING
				}
				if got.State != wantState || got.RetryAfter != 0 {
					t.Errorf("check %d: state %s retry_after %d, want %s and 0", i, got.State, got.RetryAfter, wantState)
				}
			}
			got := mustCheck(t, c, checkReq(user, "/orders"))
			if got.Allowed || got.State != quotaflowv1.State_STATE_THROTTLED || got.RetryAfter < 1 || got.RetryAfterMs < 1 {
				t.Fatalf("6th check = allowed %v state %s retry_after %d/%dms, want denied, throttled, retry_after > 0",
					got.Allowed, got.State, got.RetryAfter, got.RetryAfterMs)
			}
			if want := (got.RetryAfterMs + 999) / 1000; got.RetryAfter != want {
				t.Errorf("retry_after = %ds, want %ds (retry_after_ms %d rounded up)", got.RetryAfter, want, got.RetryAfterMs)
			}
			if now := time.Now().Unix(); got.ResetAt < now || got.ResetAt > now+3600 {
				t.Errorf("reset_at = %d, want within the hour after %d", got.ResetAt, now)
			}
			if len(got.Limits) != 1 || got.Limits[0].Algorithm != "fixed_window" || got.Limits[0].WindowMs != 3600000 {
				t.Errorf("limits = %v, want the one fixed_window 1h entry", got.Limits)
			}
		})
	}
}

// TestAlgorithms runs every algorithm through the service: limit 3 admits 3, then denies with a
// retry_after.
func TestAlgorithms(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	for _, ep := range []string{"/tb", "/lb", "/swl", "/swc", "/gcra"} {
		t.Run(ep, func(t *testing.T) {
			t.Parallel()
			user := id(t, "u")
			for i := 1; i <= 3; i++ {
				if got := mustCheck(t, c, checkReq(user, ep)); !got.Allowed || got.Remaining != int64(3-i) {
					t.Fatalf("check %d: allowed %v remaining %d, want allowed with %d left", i, got.Allowed, got.Remaining, 3-i)
				}
			}
			got := mustCheck(t, c, checkReq(user, ep))
			if got.Allowed || got.RetryAfterMs <= 0 {
				t.Fatalf("4th check: allowed %v retry_after_ms %d, want denied with a wait", got.Allowed, got.RetryAfterMs)
			}
			// Token and leaky buckets and GCRA free a unit every 20 minutes, the sliding log after
			// the hour; the sliding counter waits for the previous window's weight to fade, which
			// takes up to two windows.
			if got.RetryAfterMs > 2*3600_000 {
				t.Errorf("retry_after_ms = %d, want at most two hours", got.RetryAfterMs)
			}
		})
	}
}

func TestRefill(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user := id(t, "u")
	// A slow CI machine may take longer than one emission interval between two checks, so keep
	// checking until the burst is spent instead of assuming three checks fit in 100ms.
	var denied *quotaflowv1.CheckRateLimitResponse
	for i := 0; i < 20; i++ {
		if got := mustCheck(t, c, checkReq(user, "/fast")); !got.Allowed {
			denied = got
			break
		}
	}
	if denied == nil {
		t.Fatal("20 back-to-back checks against 2 per 200ms all allowed, want a denial")
	}
	// GCRA 2 per 200ms: one unit every 100ms.
	if denied.RetryAfterMs < 1 || denied.RetryAfterMs > 100 {
		t.Errorf("retry_after_ms = %d, want 1..100", denied.RetryAfterMs)
	}
	time.Sleep(time.Duration(denied.RetryAfterMs) * time.Millisecond)
	if got := mustCheck(t, c, checkReq(user, "/fast")); !got.Allowed {
		t.Errorf("check after retry_after (%dms) denied, want allowed", denied.RetryAfterMs)
	}
}

// TestMultiSubject: user, IP and API key of one call plus global rules must all allow, and a
// denial by one charges none.
func TestMultiSubject(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user, ip, key := id(t, "u"), id(t, "ip"), id(t, "key")
	req := func() *connect.Request[quotaflowv1.CheckRateLimitRequest] {
		return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
			Endpoint: "/api/v1/items",
			Subjects: []*quotaflowv1.Subject{
				{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user},
				{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: ip},
				{Dimension: quotaflowv1.Dimension_DIMENSION_API_KEY, Identifier: key},
			},
		})
	}
	for i := 0; i < 2; i++ {
		got := mustCheck(t, c, req())
		if !got.Allowed || len(got.Limits) != 3 {
			t.Fatalf("check %d: allowed %v with %d limits, want allowed with 3 (user, ip, apikey)", i, got.Allowed, len(got.Limits))
		}
	}
	got := mustCheck(t, c, req())
	if got.Allowed || got.RuleId != "ip-api" {
		t.Fatalf("3rd check: allowed %v rule %q, want denied by ip-api (limit 2)", got.Allowed, got.RuleId)
	}
	// The user and key were refunded: 2 of 4 and 2 of 10 used, not 3.
	q, err := c.GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
		Endpoint: "/api/v1/items", Subjects: req().Msg.Subjects}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"user-api": 2, "ip-api": 0, "key-api": 8}
	for _, l := range q.Msg.Limits {
		if l.Remaining != want[l.RuleId] {
			t.Errorf("%s remaining = %d, want %d (nothing charged by the denied check)", l.RuleId, l.Remaining, want[l.RuleId])
		}
	}
	if q.Msg.Allowed {
		t.Error("GetRemainingQuota allowed = true, want false: the IP limit is spent")
	}
}

func TestGlobalRules(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	resetGlobal(t, env, "global-g") // the one bucket every run of the test shares
	c := env.client("connect")
	// The global bucket is shared by every caller: three different users spend it.
	for i := 0; i < 3; i++ {
		if got := mustCheck(t, c, checkReq(id(t, "u")+string(rune('a'+i)), "/global/x")); !got.Allowed {
			t.Fatalf("check %d denied, want allowed", i)
		}
	}
	got := mustCheck(t, c, checkReq(id(t, "other"), "/global/y"))
	if got.Allowed || got.RuleId != "global-g" || got.Limits[0].Dimension != quotaflowv1.Dimension_DIMENSION_GLOBAL {
		t.Errorf("4th caller: allowed %v rule %q, want denied by global-g", got.Allowed, got.RuleId)
	}
}

func TestTiersAndCustomLimits(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	tests := []struct {
		name, user, tier string
		wantRule, wantT  string
		wantLimit        int64
	}{
		{"default tier", id(t, "nobody"), "", "user-orders", "free", 5},
		{"configured tier", "vip", "", "user-orders-premium", "premium", 50},
		{"request tier", id(t, "someone"), "premium", "user-orders-premium", "premium", 50},
		{"custom limit", "custom", "", "user-orders", "free", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := checkReq(tt.user, "/orders")
			req.Msg.Tier = tt.tier
			got := mustCheck(t, c, req)
			if got.RuleId != tt.wantRule || got.Tier != tt.wantT || got.Limit != tt.wantLimit {
				t.Errorf("rule %q tier %q limit %d, want %q %q %d", got.RuleId, got.Tier, got.Limit, tt.wantRule, tt.wantT, tt.wantLimit)
			}
		})
	}
}

func TestShadow(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user := id(t, "u")
	mustCheck(t, c, checkReq(user, "/shadow"))
	got := mustCheck(t, c, checkReq(user, "/shadow"))
	if !got.Allowed || len(got.Limits) != 1 || got.Limits[0].Allowed || !got.Limits[0].Shadow {
		t.Fatalf("over a shadow limit: allowed %v limits %v, want allowed with the shadow limit reporting a denial", got.Allowed, got.Limits)
	}
	if got.RuleId != "user-shadow" || got.State != quotaflowv1.State_STATE_WARNING {
		t.Errorf("rule %q state %s, want user-shadow reported as a warning", got.RuleId, got.State)
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user := id(t, "u")
	req := func(key string) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
		r := checkReq(user, "/orders")
		r.Msg.IdempotencyKey = key
		return r
	}
	first := mustCheck(t, c, req("k1"))
	again := mustCheck(t, c, req("k1"))
	if !again.Replayed || again.Remaining != first.Remaining || first.Replayed {
		t.Errorf("retry: replayed %v remaining %d, want replayed with the first remaining %d", again.Replayed, again.Remaining, first.Remaining)
	}
	if other := mustCheck(t, c, req("k2")); other.Replayed || other.Remaining != first.Remaining-1 {
		t.Errorf("new key: replayed %v remaining %d, want charged: %d", other.Replayed, other.Remaining, first.Remaining-1)
	}
}

func TestClockSkew(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	req := checkReq(id(t, "u"), "/orders")
	sent := time.Now()
	req.Msg.Timestamp = sent.Add(-90 * time.Second).UnixMilli()
	got := mustCheck(t, env.client("connect"), req)
	// The decision is made between sending and the answer, which a loaded run delays by a
	// second or more (CI once: -91013).
	took := time.Since(sent).Milliseconds()
	if got.ClockSkewMs > -89_000 || got.ClockSkewMs < -91_000-took {
		t.Errorf("clock_skew_ms = %d, want about -90000 (the answer took %d ms)", got.ClockSkewMs, took)
	}
}

func TestNoMatchingRule(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	got := mustCheck(t, env.client("connect"), checkReq(id(t, "u"), "/unlimited"))
	if !got.Allowed || len(got.Limits) != 0 || got.RuleId != "" {
		t.Errorf("allowed %v limits %d rule %q, want allowed with no limit", got.Allowed, len(got.Limits), got.RuleId)
	}
}

func TestResetLimit(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user := id(t, "u")
	for i := 0; i < 5; i++ {
		mustCheck(t, c, checkReq(user, "/orders"))
	}
	mustCheck(t, c, checkReq(user, "/tb"))
	if got := mustCheck(t, c, checkReq(user, "/orders")); got.Allowed {
		t.Fatal("6th check allowed, want denied")
	}
	resp, err := c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders"}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Msg.ResetCount != 1 {
		t.Errorf("reset_count = %d, want 1 (the /orders bucket shared by both tiers' rules)", resp.Msg.ResetCount)
	}
	if got := mustCheck(t, c, checkReq(user, "/orders")); !got.Allowed || got.Remaining != 4 {
		t.Errorf("after reset: allowed %v remaining %d, want allowed with 4 left", got.Allowed, got.Remaining)
	}
	// The /tb bucket was not named, so it was kept.
	if got := mustCheck(t, c, checkReq(user, "/tb")); got.Remaining != 1 {
		t.Errorf("/tb remaining = %d, want 1 (untouched by the reset)", got.Remaining)
	}
	_, err = c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, RuleId: "nope"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("reset of an unknown rule: %v, want InvalidArgument", err)
	}
}

// TestExactAcrossCheckers: several checker processes (separate servers and Redis connections)
// hammer one key concurrently; exactly the limit is admitted.
func TestExactAcrossCheckers(t *testing.T) {
	t.Parallel()
	const checkers, perChecker = 4, 100
	doc := `rules:
- {id: fw, dimension: user, endpoint: /fw, algorithm: fixed_window, limit: 50, window: 1h}
- {id: tb, dimension: user, endpoint: /tb, algorithm: token_bucket, limit: 50, window: 1h}
- {id: gcra, dimension: user, endpoint: /gcra, algorithm: gcra, limit: 50, window: 1h}
- {id: swl, dimension: user, endpoint: /swl, algorithm: sliding_window_log, limit: 50, window: 1h}
`
	set := mustRules(t, doc)
	var envs []*testEnv
	for i := 0; i < checkers; i++ {
		envs = append(envs, newEnv(t, checker.Config{Rules: set}))
	}
	for _, ep := range []string{"/fw", "/tb", "/gcra", "/swl"} {
		t.Run(ep, func(t *testing.T) {
			user := id(t, "u")
			var allowed atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, checkers*perChecker)
			for _, env := range envs {
				c := env.client("grpc")
				for j := 0; j < perChecker; j++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						resp, err := c.CheckRateLimit(context.Background(), checkReq(user, ep))
						if err != nil {
							errs <- err
							return
						}
						if resp.Msg.Degraded {
							errs <- errors.New("degraded decision")
						}
						if resp.Msg.Allowed {
							allowed.Add(1)
						}
					}()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := allowed.Load(); got != 50 {
				t.Errorf("%d concurrent checks from %d checkers admitted %d, want exactly 50", checkers*perChecker, checkers, got)
			}
		})
	}
}

// resetGlobal empties the global bucket of rule, which no identifier can make a test's own.
func resetGlobal(t *testing.T, env *testEnv, rule string) {
	t.Helper()
	if _, _, err := env.engine.Reset(context.Background(), checker.ResetRequest{Subject: checker.Subject{Dimension: rules.DimensionGlobal}, RuleID: rule}); err != nil {
		t.Fatalf("reset the global bucket of %s: %v", rule, err)
	}
}
