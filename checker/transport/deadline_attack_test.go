package transport

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
)

// attackRules: a victim's limit, a fail_mode closed rule that must keep allowing while Redis
// is up, and the limit the attackers share.
const attackRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: victim, dimension: user, endpoint: /victim, algorithm: fixed_window, limit: 50, window: 1h}
  - {id: closed, dimension: user, endpoint: /closed, algorithm: fixed_window, limit: 1000000, window: 1h, fail_mode: closed}
  - {id: attacker, dimension: user, endpoint: /attack, algorithm: gcra, limit: 50, window: 1h}
`

// TestDeadlineAttack is issue 20's first attack: callers sending checks with 1 ms deadlines
// (Connect-Timeout-Ms: 1 over Connect, a 1 ms gRPC deadline) must bound only their own wait.
// Before, the batch ran under its earliest caller's deadline and the guard took the timeout
// for Redis being down: the circuit opened, a victim's checks were allowed by fail mode open
// far past its limit, fail_mode closed rules refused everyone and /readyz answered 503.
// Meanwhile here: the victim gets exactly its 50, none degraded; the closed rule keeps
// allowing; /readyz stays 200; the attackers never get more than their own limit.
func TestDeadlineAttack(t *testing.T) {
	t.Parallel()
	// A generous timeout: on a loaded CI machine no honest check may wait past it, so any
	// degraded answer is the attack's doing.
	env := newEnv(t, checker.Config{Rules: mustRules(t, attackRules), RedisTimeout: 2 * time.Second})
	victim, bystander, attacker := id(t, "victim"), id(t, "bystander"), id(t, "attacker")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var attackAllowed, attacks atomic.Int64
	body := []byte(`{"identifier":"` + attacker + `","dimension":"DIMENSION_USER","endpoint":"/attack"}`)
	for range 2 {
		wg.Go(func() { // Connect with Connect-Timeout-Ms: 1
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.url+"/quotaflow.v1.RateLimiter/CheckRateLimit", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Connect-Timeout-Ms", "1")
				if resp, err := env.http.Do(req); err == nil {
					var buf bytes.Buffer
					_, _ = buf.ReadFrom(resp.Body)
					resp.Body.Close()
					attacks.Add(1)
					if resp.StatusCode == 200 && bytes.Contains(buf.Bytes(), []byte(`"allowed":true`)) {
						attackAllowed.Add(1)
					}
				}
			}
		})
		wg.Go(func() { // gRPC with a 1 ms deadline
			c := env.client("grpc")
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
				resp, err := c.CheckRateLimit(cctx, checkReq(attacker, "/attack"))
				cancel()
				attacks.Add(1)
				if err == nil && resp.Msg.Allowed {
					attackAllowed.Add(1)
				}
			}
		})
	}
	var notReady atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			if resp, err := env.http.Get(env.url + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					notReady.Add(1)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	// Let the attack run before the victim starts, and keep it up while the victim checks.
	time.Sleep(300 * time.Millisecond)
	c := env.client("connect")
	allowed, degraded, closedRefused := 0, 0, 0
	for range 300 {
		got := mustCheck(t, c, checkReq(victim, "/victim"))
		if got.Allowed {
			allowed++
		}
		if got.Degraded {
			degraded++
		}
		if got := mustCheck(t, c, checkReq(bystander, "/closed")); !got.Allowed || got.Degraded {
			closedRefused++
		}
	}
	stop()
	wg.Wait()

	t.Logf("%d attacking calls, %d of them allowed", attacks.Load(), attackAllowed.Load())
	if allowed != 50 || degraded != 0 {
		t.Errorf("victim: %d of 300 allowed, %d degraded; want exactly 50 allowed, none degraded", allowed, degraded)
	}
	if closedRefused != 0 {
		t.Errorf("fail_mode closed rule: %d of 300 checks refused or degraded while Redis was up, want 0", closedRefused)
	}
	if n := notReady.Load(); n != 0 {
		t.Errorf("/readyz answered other than 200 %d times during the attack, want never", n)
	}
	if n := attackAllowed.Load(); n > 50 {
		t.Errorf("attacker: %d checks allowed against a limit of 50", n)
	}
}
