package transport

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// newFailureEnv serves a checker on a Redis of its own, with a short deadline and probe, so that
// the test can stop and stall that Redis.
func newFailureEnv(t *testing.T, sink checker.DecisionSink) (*redistest.Server, *testEnv) {
	t.Helper()
	// The deadline must hold on a loaded CI machine (race detector, parallel tests) while Redis is
	// up, and be much shorter than the stall TestRedisSlow makes.
	rs, env, _ := ownRedisEnv(t, checker.Config{RedisTimeout: 250 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, Decisions: sink})
	// Load the script and warm the connection pool, so that the first asserted check is not
	// the slow one.
	mustCheck(t, env.client("connect"), checkReq("warm-up", "/fm/local"))
	poll.Until(t, 10*time.Second, "the checker ready", func() error { return env.engine.Ready(context.Background()) })
	return rs, env
}

// TestRedisDown stops the real Redis: each rule's fail mode decides, the response says so,
// readiness turns false; when Redis is back, exact decisions resume by themselves.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	rs, env := newFailureEnv(t, nil)
	c := env.client("connect")
	for _, ep := range []string{"/fm/open", "/fm/closed"} {
		if got := mustCheck(t, c, checkReq("u", ep)); !got.Allowed || got.Degraded {
			t.Fatalf("%s with redis up: allowed %v degraded %v, want an exact allow", ep, got.Allowed, got.Degraded)
		}
	}

	rs.Stop()
	// fm-open's limit (1) is already spent in Redis, but open allows while Redis is away.
	got := mustCheck(t, c, checkReq("u", "/fm/open"))
	if !got.Allowed || !got.Degraded || !got.Limits[0].Degraded || got.Limits[0].FailMode != "open" {
		t.Errorf("fail open: allowed %v degraded %v limits %v, want a degraded allow by fail mode open", got.Allowed, got.Degraded, got.Limits)
	}
	got = mustCheck(t, c, checkReq("u", "/fm/closed"))
	if got.Allowed || !got.Degraded || got.RetryAfter < 1 || got.Limits[0].FailMode != "closed" {
		t.Errorf("fail closed: allowed %v degraded %v retry_after %d, want a degraded denial with retry_after", got.Allowed, got.Degraded, got.RetryAfter)
	}
	for i, want := range []bool{true, true, false} {
		got = mustCheck(t, c, checkReq("u", "/fm/local"))
		if got.Allowed != want || !got.Degraded || got.Limits[0].FailMode != "local" {
			t.Errorf("fail local check %d: allowed %v degraded %v, want allowed %v from the in-process bucket (limit 2)", i, got.Allowed, got.Degraded, want)
		}
	}
	if err := env.engine.Ready(context.Background()); err == nil {
		t.Error("Ready with redis down = nil, want an error")
	}
	resp, err := env.http.Get(env.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("/readyz with redis down = %d, want 503", resp.StatusCode)
	}
	hc := healthClient(env.url)
	if h, err := hc.CallUnary(context.Background(), connect.NewRequest(&healthpb.HealthCheckRequest{})); err != nil || h.Msg.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("grpc health with redis down = %v, %v, want NOT_SERVING", h, err)
	}
	// Resets need Redis: they fail rather than pretend.
	_, err = c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: "u", Dimension: quotaflowv1.Dimension_DIMENSION_USER}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("reset with redis down: %v, want Unavailable", err)
	}

	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the checker ready", func() error { return env.engine.Ready(context.Background()) })
	got = mustCheck(t, c, checkReq("u", "/fm/closed"))
	if !got.Allowed || got.Degraded {
		t.Errorf("after recovery: allowed %v degraded %v, want an exact allow (the restarted redis is empty)", got.Allowed, got.Degraded)
	}
}

// TestRedisSlow stalls Redis: checks do not wait past the deadline, the fail mode decides.
func TestRedisSlow(t *testing.T) {
	t.Parallel()
	rs, env := newFailureEnv(t, nil)
	c := env.client("connect")
	mustCheck(t, c, checkReq("u", "/fm/closed"))

	// Pause every client's commands for 1s: Redis is up but answers nothing in time.
	pauser := newRedis(rs.Addr)
	defer pauser.Close()
	if err := pauser.Do(context.Background(), "CLIENT", "PAUSE", "1000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	got := mustCheck(t, c, checkReq("u2", "/fm/closed"))
	if got.Allowed || !got.Degraded {
		t.Errorf("with redis stalled: allowed %v degraded %v, want a degraded fail-closed denial", got.Allowed, got.Degraded)
	}
	poll.Until(t, 10*time.Second, "the checker ready", func() error { return env.engine.Ready(context.Background()) })
	// u2's timed-out command ran when the pause ended (a sent command cannot be taken back), so
	// look at fresh subjects. On an overloaded machine a check may still miss the deadline while
	// the connections that timed out are replaced, and a round trip sent during the stall may
	// report its failure after it (a batch outlives the checks it carries), opening the circuit
	// until the next probe: exact answers must be back within a few probes.
	var got2 *quotaflowv1.CheckRateLimitResponse
	for i, deadline := 0, time.Now().Add(5*time.Second); time.Now().Before(deadline); i++ {
		if got2 = mustCheck(t, c, checkReq(fmt.Sprintf("u3-%d", i), "/fm/closed")); got2.Allowed && !got2.Degraded {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !got2.Allowed || got2.Degraded {
		t.Errorf("after the stall: allowed %v degraded %v, want an exact allow", got2.Allowed, got2.Degraded)
	}
}
