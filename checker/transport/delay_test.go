package transport

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestDelay: a rule with on_limit: delay (user-delay: 5 a second, one at once, 600 ms of
// queue) answers 5 concurrent checks one allowed at once, three allowed after a delay of at
// most 600 ms, each its own slot, and one denied past the queue: over the check RPC, each
// protocol alike.
func TestDelay(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := env.client(protocol)
			user := id(t, "u")
			answers := make([]*quotaflowv1.CheckRateLimitResponse, 5)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
						Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/delay"}))
					if err != nil {
						t.Error(err)
						return
					}
					answers[i] = resp.Msg
				}()
			}
			wg.Wait()
			var now, delayed, denied int
			for _, m := range answers {
				switch {
				case m == nil:
				case !m.Allowed:
					denied++
					if m.DelayUs != 0 || m.RetryAfterMs <= 0 {
						t.Errorf("denied check: delay %dµs retry %dms, want no delay and a retry", m.DelayUs, m.RetryAfterMs)
					}
				case len(m.Limits) != 1 || m.Limits[0].DelayUs != m.DelayUs || m.DelayUs > 600_000:
					t.Errorf("allowed check: %v, want its limit's delay, at most 600ms", m)
				case m.DelayUs == 0:
					now++
				default:
					delayed++
				}
			}
			if now != 1 || delayed != 3 || denied != 1 {
				t.Errorf("%d allowed at once, %d delayed, %d denied; want 1, 3 and 1", now, delayed, denied)
			}
		})
	}
}

// TestDelaySpacing: the slots a queue gives (decision time plus delay, on Redis's clock) are
// spaced by window/limit to the µs, however the checks arrive: 4 concurrent checks of the
// engine.
func TestDelaySpacing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	user := id(t, "u")
	slots := make([]time.Time, 4)
	var wg sync.WaitGroup
	for i := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := env.engine.Check(context.Background(), &checker.Query{Subjects: []checker.Subject{{Dimension: 1, ID: user}}, Endpoint: "/delay", Cost: 1})
			if err != nil || !out.Allowed {
				t.Errorf("check: %v %v, want allowed", out, err)
				return
			}
			slots[i] = out.Now.Add(out.Delay)
		}()
	}
	wg.Wait()
	slices.SortFunc(slots, time.Time.Compare)
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 200*time.Millisecond-2*time.Microsecond || gap > 200*time.Millisecond+2*time.Microsecond {
			t.Errorf("slot %d comes %v after the one before, want 200ms (±2µs)", i+1, gap)
		}
	}
}

// TestForwardAuthDelay: forward-auth gives a queued request's delay in X-Quotaflow-Delay-Ms
// and delay_ms; with ?wait=true it answers at the request's slot instead, with neither. A bad
// wait is refused naming it. Each user's burst is taken by the engine first, so that the
// request is queued.
func TestForwardAuthDelay(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	fill := func(user string) {
		t.Helper()
		if out, err := env.engine.Check(context.Background(), &checker.Query{Subjects: []checker.Subject{{Dimension: 1, ID: user}}, Endpoint: "/delay", Cost: 1}); err != nil || !out.Allowed || out.Delay != 0 {
			t.Fatalf("first check: %v %v, want allowed at once", out, err)
		}
	}
	get := func(user, query string) (*http.Response, forwardAuthBody) {
		t.Helper()
		req, _ := http.NewRequest("GET", env.url+"/ratelimit/check"+query, nil)
		req.Header.Set("X-User-Id", user)
		req.Header.Set("X-Forwarded-Uri", "/delay")
		resp, err := env.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var body forwardAuthBody
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatalf("%v: %s", err, b)
			}
		}
		return resp, body
	}
	a := id(t, "a")
	fill(a)
	resp, body := get(a, "")
	header, _ := strconv.ParseInt(resp.Header.Get("X-Quotaflow-Delay-Ms"), 10, 64)
	if resp.StatusCode != 200 || header <= 0 || header > 200 || body.DelayMs != header {
		t.Errorf("queued check = %d, X-Quotaflow-Delay-Ms %q, delay_ms %d; want 200 with a delay of up to 200ms in both", resp.StatusCode,
			resp.Header.Get("X-Quotaflow-Delay-Ms"), body.DelayMs)
	}
	// With ?wait=true the answer comes at the slot: 200 ms after the first check's decision,
	// so at least 200 ms after it began.
	b := id(t, "b")
	start := time.Now()
	fill(b)
	resp, body = get(b, "?wait=true")
	if took := time.Since(start); resp.StatusCode != 200 || resp.Header.Get("X-Quotaflow-Delay-Ms") != "" || body.DelayMs != 0 || took < 200*time.Millisecond {
		t.Errorf("queued check with ?wait=true = %d %v after the first, delay header %q, body %d; want 200 at its slot, 200ms after the first, without a delay to wait",
			resp.StatusCode, took, resp.Header.Get("X-Quotaflow-Delay-Ms"), body.DelayMs)
	}
	if resp, _ := get(b, "?wait=soon"); resp.StatusCode != 400 {
		t.Errorf("?wait=soon = %d, want 400", resp.StatusCode)
	}
}

// TestForwardAuthWaitCap: ?wait=true holds at most MaxWaiting requests at once; a delayed
// request past it is answered at once with its wait in X-Quotaflow-Delay-Ms (charged at its
// slot all the same), so that no number of them holds the process's memory.
func TestForwardAuthWaitCap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		maxWaiting int
		wantHeld   int
	}{{"one place", 1, 1}, {"none", -1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnvWith(t, checker.Config{Rules: mustRules(t, `
rules:
  - {id: queue, dimension: user, endpoint: /q, algorithm: gcra, limit: 2, window: 4s, burst: 1, on_limit: delay, max_delay: 4s}
`)}, Config{ForwardAuth: ForwardAuthConfig{MaxWaiting: tc.maxWaiting}})
			user := id(t, "u")
			if out, err := env.engine.Check(context.Background(), &checker.Query{Subjects: []checker.Subject{{Dimension: 1, ID: user}}, Endpoint: "/q", Cost: 1}); err != nil || !out.Allowed || out.Delay != 0 {
				t.Fatalf("first check: %v %v, want allowed at once", out, err)
			}
			told := make(chan string, 2)
			for range 2 {
				go func() {
					req, _ := http.NewRequest("GET", env.url+"/ratelimit/check?wait=true", nil)
					req.Header.Set("X-User-Id", user)
					req.Header.Set("X-Forwarded-Uri", "/q")
					resp, err := env.http.Do(req)
					if err != nil {
						told <- "error: " + err.Error()
						return
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						told <- "status " + resp.Status
						return
					}
					told <- resp.Header.Get("X-Quotaflow-Delay-Ms")
				}()
			}
			held := 0
			for range 2 {
				switch h := <-told; {
				case h == "":
					held++
				case strings.HasPrefix(h, "error") || strings.HasPrefix(h, "status"):
					t.Fatal(h)
				default:
					if ms, err := strconv.ParseInt(h, 10, 64); err != nil || ms <= 0 {
						t.Errorf("X-Quotaflow-Delay-Ms %q, want the wait in ms", h)
					}
				}
			}
			if held != tc.wantHeld {
				t.Errorf("%d of 2 delayed requests held, want %d (MaxWaiting %d)", held, tc.wantHeld, tc.maxWaiting)
			}
		})
	}
}
