package transport

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const conflictMsg = "idempotency_key: already used with another request"

// TestIdempotencyConflictRPC: over Connect, gRPC and gRPC-Web, a key reused for another
// request is InvalidArgument naming idempotency_key; the same request is still a replay.
func TestIdempotencyConflictRPC(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := env.client(protocol)
			req := func(endpoint string) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
				r := checkReq(id(t, "u"), endpoint)
				r.Msg.IdempotencyKey = "k"
				return r
			}
			first := mustCheck(t, c, req("/orders"))
			if again := mustCheck(t, c, req("/orders")); !again.Replayed || again.Remaining != first.Remaining {
				t.Errorf("retry: replayed %v remaining %d, want the first decision (remaining %d) replayed", again.Replayed, again.Remaining, first.Remaining)
			}
			_, err := c.CheckRateLimit(context.Background(), req("/tb"))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), conflictMsg) {
				t.Errorf("same key, another endpoint: %v; want InvalidArgument %q", err, conflictMsg)
			}
		})
	}
}

// fwdCheck is one forward-auth check of user at endpoint with an idempotency key; it returns
// the status, the JSON body and the decision id.
func fwdCheck(t *testing.T, env *testEnv, user, endpoint, key string) (int, map[string]any, string) {
	t.Helper()
	resp, body := getForwardAuth(t, env, map[string]string{"X-User-Id": user, "X-Forwarded-Uri": endpoint, "X-Idempotency-Key": key}, "")
	return resp.StatusCode, body, resp.Header.Get("X-Quotaflow-Decision-Id")
}

// TestIdempotencyConflictForwardAuth: through forward-auth a key reused for another request is
// 409 with the error code "conflict"; the same request is still a replay.
func TestIdempotencyConflictForwardAuth(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	user := id(t, "u")
	if status, body, _ := fwdCheck(t, env, user, "/orders", "k"); status != http.StatusOK {
		t.Fatalf("first check = %d %v, want 200", status, body)
	}
	if status, body, _ := fwdCheck(t, env, user, "/orders", "k"); status != http.StatusOK {
		t.Errorf("retry = %d %v, want 200 (a replay)", status, body)
	}
	status, body, _ := fwdCheck(t, env, user, "/tb", "k")
	if status != http.StatusConflict || body["error"] != "conflict" || !strings.Contains(fmt.Sprint(body["message"]), conflictMsg) {
		t.Errorf("same key, another endpoint = %d %v, want 409 conflict %q", status, body, conflictMsg)
	}
}

// TestIdempotencyAbuse reproduces the reported abuse: one idempotency key on every request made
// 9 of 9 checks pass a limit of 5 per 10s through forward-auth, each replaying the first
// decision. Bound to the request, the key now passes one of 9 different requests; the others
// are refused (409) and charge nothing. Identical requests are still replays, as a retry must
// be, and every one of them is published as a replay.
func TestIdempotencyAbuse(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	env := newEnv(t, checker.Config{Decisions: rec, Rules: mustRules(t, `
rules:
  - {id: five-per-10s, dimension: user, endpoint: /api/*, algorithm: sliding_window_log, limit: 5, window: 10s}
`)})
	remaining := func(t *testing.T, user string) int64 {
		t.Helper()
		resp, err := env.client("connect").GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
			Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/api/x"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Remaining
	}

	t.Run("same key, different requests", func(t *testing.T) {
		t.Parallel()
		user := id(t, "u")
		allowed, conflicts := 0, 0
		for i := range 9 {
			switch status, body, _ := fwdCheck(t, env, user, fmt.Sprintf("/api/%d", i), "one-key"); {
			case status == http.StatusOK:
				allowed++
			case status == http.StatusConflict && body["error"] == "conflict":
				conflicts++
			default:
				t.Errorf("check %d = %d %v, want 200 or 409 conflict", i, status, body)
			}
		}
		if allowed != 1 || conflicts != 8 {
			t.Errorf("%d allowed, %d refused as conflicts; want 1 and 8", allowed, conflicts)
		}
		if got := remaining(t, user); got != 4 {
			t.Errorf("remaining %d, want 4: the conflicts charge nothing", got)
		}
	})

	t.Run("same key, same request", func(t *testing.T) {
		t.Parallel()
		user := id(t, "u")
		var ids []string
		for i := range 9 {
			status, body, decision := fwdCheck(t, env, user, "/api/orders", "retried-key")
			if status != http.StatusOK {
				t.Fatalf("check %d = %d %v, want 200", i, status, body)
			}
			ids = append(ids, decision)
		}
		if got := remaining(t, user); got != 4 {
			t.Errorf("remaining %d, want 4: one charge, 8 replays", got)
		}
		events := rec.byID()
		for i, decision := range ids {
			d := events[decision]
			switch {
			case d == nil:
				t.Errorf("check %d: no decision published with id %q", i, decision)
			case d.Replayed != (i > 0):
				t.Errorf("check %d: published replayed = %v, want %v", i, d.Replayed, i > 0)
			}
		}
	})
}

// TestIdempotencyKeyPerSubjectForwardAuth (issue 20, item 6): user B sending the idempotency
// key user A used is B's own check, 200 and charged, not 409: a record belonged to the global
// subject, which every check shares. A's retry still replays.
func TestIdempotencyKeyPerSubjectForwardAuth(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, `
rules:
  - {id: user-item6, dimension: user, endpoint: /item6/*, algorithm: token_bucket, limit: 100, window: 1h}
  - {id: global-item6, dimension: global, endpoint: /item6/*, algorithm: fixed_window, limit: 1000000, window: 1h}
`)})
	a, b, key := id(t, "a"), id(t, "b"), id(t, "key")
	for _, user := range []string{a, b} {
		status, body, _ := fwdCheck(t, env, user, "/item6/orders", key)
		if status != http.StatusOK || body["replayed"] == true {
			t.Errorf("user %s = %d %v, want 200, decided afresh", user, status, body)
		}
	}
	if status, body, _ := fwdCheck(t, env, a, "/item6/orders", key); status != http.StatusOK {
		t.Errorf("A's retry = %d %v, want 200 (a replay)", status, body)
	}
}
