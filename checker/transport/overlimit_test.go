package transport

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// scriptCalls counts the calls of the check script, batch script and batch function Redis has run.
func scriptCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") || strings.HasPrefix(line, "cmdstat_fcall:") {
			calls, _, _ := strings.Cut(strings.TrimPrefix(line[strings.IndexByte(line, ':')+1:], "calls="), ",")
			c, _ := strconv.Atoi(calls)
			n += c
		}
	}
	return n
}

func TestOverLimitCache(t *testing.T) {
	t.Parallel()
	_, env, rdb := ownRedisEnv(t, checker.Config{})
	c := env.client("connect")
	for i := 0; i < 5; i++ {
		mustCheck(t, c, checkReq("hammer", "/orders"))
	}
	first := mustCheck(t, c, checkReq("hammer", "/orders"))
	if first.Allowed {
		t.Fatal("6th check allowed, want denied")
	}
	before := scriptCalls(t, rdb)
	for i := 0; i < 20; i++ {
		got := mustCheck(t, c, checkReq("hammer", "/orders"))
		if got.Allowed || got.RuleId != "user-orders" || got.RetryAfterMs <= 0 || got.RetryAfterMs > first.RetryAfterMs || got.DecisionId == "" {
			t.Fatalf("cached denial %d: allowed %v rule %q retry %dms (first %dms), want a denial by user-orders counting down",
				i, got.Allowed, got.RuleId, got.RetryAfterMs, first.RetryAfterMs)
		}
	}
	if calls := scriptCalls(t, rdb) - before; calls != 0 {
		t.Errorf("20 checks of a spent limit made %d Redis calls, want 0 (answered from the cache)", calls)
	}
	// Another subject, and the same subject on another bucket, still go to Redis.
	if got := mustCheck(t, c, checkReq("other", "/orders")); !got.Allowed {
		t.Error("another subject denied, want allowed")
	}
	if got := mustCheck(t, c, checkReq("hammer", "/tb")); !got.Allowed {
		t.Error("another bucket of the same subject denied, want allowed")
	}
	// A reset gives the capacity back at once.
	if _, err := c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: "hammer", Dimension: quotaflowv1.Dimension_DIMENSION_USER})); err != nil {
		t.Fatal(err)
	}
	if got := mustCheck(t, c, checkReq("hammer", "/orders")); !got.Allowed {
		t.Error("check after ResetLimit denied from the cache, want allowed")
	}
}

// TestOverLimitCacheIsExact: a cached denial never outlives the real one, and a denial of a
// large cost does not deny a smaller one.
func TestOverLimitCacheIsExact(t *testing.T) {
	t.Parallel()
	doc := `rules:
- {id: g, dimension: user, endpoint: /g, algorithm: gcra, limit: 4, window: 200ms}
- {id: tb, dimension: user, endpoint: /tb, algorithm: token_bucket, limit: 10, window: 1h}
`
	env := newEnv(t, checker.Config{Rules: mustRules(t, doc)})
	c := env.client("connect")
	user := id(t, "exact")
	// Check until denied: a slow machine may refill a unit between two checks.
	var denied *quotaflowv1.CheckRateLimitResponse
	for i := 0; i < 40 && denied == nil; i++ {
		if got := mustCheck(t, c, checkReq(user, "/g")); !got.Allowed {
			denied = got
		}
	}
	if denied == nil {
		t.Fatal("40 back-to-back checks against 4 per 200ms all allowed, want a denial")
	}
	time.Sleep(time.Duration(denied.RetryAfterMs) * time.Millisecond)
	if got := mustCheck(t, c, checkReq(user, "/g")); !got.Allowed {
		t.Errorf("check after retry_after %dms denied, want allowed (the cache must not outlive the denial)", denied.RetryAfterMs)
	}

	big := checkReq(user, "/tb")
	big.Msg.Cost = 8
	mustCheck(t, c, big) // 2 left
	if got := mustCheck(t, c, big); got.Allowed {
		t.Fatal("cost 8 with 2 left allowed, want denied")
	}
	if got := mustCheck(t, c, checkReq(user, "/tb")); !got.Allowed {
		t.Error("cost 1 with 2 left denied from the cache of a cost-8 denial, want allowed")
	}
}

func TestOverLimitCacheOff(t *testing.T) {
	t.Parallel()
	_, env, rdb := ownRedisEnv(t, checker.Config{DisableOverLimitCache: true})
	c := env.client("connect")
	for i := 0; i < 6; i++ {
		mustCheck(t, c, checkReq("hammer", "/orders"))
	}
	before := scriptCalls(t, rdb)
	for i := 0; i < 5; i++ {
		if got := mustCheck(t, c, checkReq("hammer", "/orders")); got.Allowed {
			t.Fatal("spent limit allowed")
		}
	}
	if calls := scriptCalls(t, rdb) - before; calls != 5 {
		t.Errorf("5 checks with the cache off made %d Redis calls, want 5", calls)
	}
}
