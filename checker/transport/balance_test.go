package transport

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestGetBalance: a balance over each protocol and HTTP/JSON, its grants with what each has
// left; an unknown entitlement is NotFound, a missing subject InvalidArgument naming it.
func TestGetBalance(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, testRules+"entitlements:\n  - {id: tokens, dimension: user, period: 1mo}\n")})
	user := id(t, "u")
	for _, g := range []rules.Grant{
		{ID: "plan", Entitlement: "tokens", Subject: user, Amount: 1000, Recurring: true, Reason: "pro plan"},
		{ID: "promo", Entitlement: "tokens", Subject: user, Amount: 200, Priority: 2, Reason: "welcome"},
	} {
		if _, _, err := env.engine.PutGrant(context.Background(), g); err != nil {
			t.Fatal(err)
		}
	}
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			resp, err := env.client(protocol).GetBalance(context.Background(), connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "tokens", Subject: user}))
			if err != nil {
				t.Fatal(err)
			}
			b := resp.Msg
			if b.Remaining != 1200 || b.Dimension != "user" || len(b.Grants) != 2 || b.PeriodEndMs <= b.PeriodStartMs || b.Used != 0 {
				t.Fatalf("GetBalance = %v, want 1200 left in two grants this month", b)
			}
			for _, g := range b.Grants {
				if !g.Live || g.Remaining != g.Amount || g.Reason == "" || (g.Id == "plan") != g.Recurring {
					t.Errorf("grant %v, want live and whole, with its reason", g)
				}
			}
			_, err = env.client(protocol).GetBalance(context.Background(), connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "gold", Subject: user}))
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("an unknown entitlement: %v, want NotFound", err)
			}
			_, err = env.client(protocol).GetBalance(context.Background(), connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "tokens"}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "subject") {
				t.Errorf("no subject: %v, want InvalidArgument naming subject", err)
			}
		})
	}
	// A caller's deadline of 1ms: the balance, or DeadlineExceeded; never a hang, nor an
	// outage reported for a caller that gave up.
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		resp, err := env.client("connect").GetBalance(ctx, connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "tokens", Subject: user}))
		cancel()
		if code := connect.CodeOf(err); err != nil && code != connect.CodeDeadlineExceeded && code != connect.CodeCanceled {
			t.Fatalf("GetBalance with a 1ms deadline: %v, want DeadlineExceeded", err)
		} else if err == nil && resp.Msg.Remaining != 1200 {
			t.Fatalf("GetBalance with a 1ms deadline = %v", resp.Msg)
		}
	}
	// HTTP/JSON, as curl sends it.
	resp, err := env.http.Post(env.url+"/quotaflow.v1.RateLimiter/GetBalance", "application/json",
		strings.NewReader(`{"entitlement":"tokens","subject":"`+user+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HTTP/JSON GetBalance: %s, want 200", resp.Status)
	}
}

// TestCheckEntitlement: a check naming an entitlement burns its balance and reports it among
// its limits, over each protocol and HTTP/JSON; an undeclared entitlement is InvalidArgument
// naming the field; an empty balance is a denial, not an error.
func TestCheckEntitlement(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, testRules+"entitlements:\n  - {id: tokens, dimension: user, period: 1mo}\n")})
	user := id(t, "u")
	if _, _, err := env.engine.PutGrant(context.Background(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 30, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	left := int64(30)
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		resp, err := env.client(protocol).CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
			Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/metered", Cost: 10, Entitlement: "tokens"}))
		if err != nil {
			t.Fatalf("%s: %v", protocol, err)
		}
		left -= 10
		m := resp.Msg
		if !m.Allowed || len(m.Limits) != 1 || m.Limits[0].Algorithm != "balance" || m.Limits[0].RuleId != "tokens" ||
			m.Limits[0].Remaining != left || m.Remaining != left || m.Limits[0].Limit != 30 {
			t.Fatalf("%s: %v; want allowed, the balance reported with %d left of 30", protocol, m, left)
		}
	}
	resp, err := env.client("connect").CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/metered", Entitlement: "tokens"}))
	if err != nil || resp.Msg.Allowed || resp.Msg.RetryAfterMs <= 0 {
		t.Fatalf("a check of an empty balance: %v, %v; want denied with a retry", resp, err)
	}
	_, err = env.client("connect").CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/metered", Entitlement: "gold"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `entitlement: "gold" is not a declared entitlement`) {
		t.Errorf("an undeclared entitlement: %v, want InvalidArgument naming the field", err)
	}
	hr, err := env.http.Post(env.url+"/quotaflow.v1.RateLimiter/CheckRateLimit", "application/json",
		strings.NewReader(`{"identifier":"`+user+`","dimension":"DIMENSION_USER","endpoint":"/metered","entitlement":"tokens"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	var body strings.Builder
	_, _ = io.Copy(&body, hr.Body)
	if hr.StatusCode != http.StatusOK || !strings.Contains(body.String(), `"algorithm":"balance"`) || strings.Contains(body.String(), `"allowed":true`) || !strings.Contains(body.String(), `"state":"STATE_THROTTLED"`) {
		t.Errorf("HTTP/JSON: %s %s; want 200 and a denial by the balance", hr.Status, body.String())
	}
}

// TestRecordUsage: usage recorded over each protocol and HTTP/JSON burns its balance once per
// event id; an unknown entitlement is NotFound, a bad amount InvalidArgument naming it.
func TestRecordUsage(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, testRules+"entitlements:\n  - {id: tokens, dimension: user, period: 1mo}\n")})
	user := id(t, "u")
	if _, _, err := env.engine.PutGrant(context.Background(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 100, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	left := int64(100)
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		for try := range 2 {
			resp, err := env.client(protocol).RecordUsage(context.Background(), connect.NewRequest(&quotaflowv1.RecordUsageRequest{
				Entitlement: "tokens", Subject: user, Amount: 20, EventId: "evt-" + protocol}))
			if err != nil {
				t.Fatalf("%s: %v", protocol, err)
			}
			if try == 0 {
				left -= 20
			}
			if m := resp.Msg; m.Replayed != (try == 1) || m.Taken != 20 || m.Balance.GetRemaining() != left || m.DecisionId == "" {
				t.Fatalf("%s, try %d: %v; want %d left, replayed on the second", protocol, try, m, left)
			}
		}
	}
	_, err := env.client("connect").RecordUsage(context.Background(), connect.NewRequest(&quotaflowv1.RecordUsageRequest{
		Entitlement: "gold", Subject: user, Amount: 1, EventId: "x"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("an unknown entitlement: %v, want NotFound", err)
	}
	for _, tt := range []struct {
		name  string
		req   *quotaflowv1.RecordUsageRequest
		field string
	}{
		{"event id too long", &quotaflowv1.RecordUsageRequest{Entitlement: "tokens", Subject: user, Amount: 1, EventId: strings.Repeat("e", 257)}, "event_id"},
		{"no event id", &quotaflowv1.RecordUsageRequest{Entitlement: "tokens", Subject: user, Amount: 1}, "event_id"},
		{"amount past 2^44", &quotaflowv1.RecordUsageRequest{Entitlement: "tokens", Subject: user, Amount: 1<<44 + 1, EventId: "x"}, "amount"},
		{"subject too long", &quotaflowv1.RecordUsageRequest{Entitlement: "tokens", Subject: strings.Repeat("s", 257), Amount: 1, EventId: "x"}, "subject"},
	} {
		_, err := env.client("grpc").RecordUsage(context.Background(), connect.NewRequest(tt.req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: %v, want InvalidArgument naming %s", tt.name, err, tt.field)
		}
	}
	// A caller's deadline of 1ms: the record, or DeadlineExceeded; never an outage.
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, err := env.client("connect").RecordUsage(ctx, connect.NewRequest(&quotaflowv1.RecordUsageRequest{
			Entitlement: "tokens", Subject: user, Amount: 1, EventId: fmt.Sprintf("deadline-%d", i)}))
		cancel()
		if code := connect.CodeOf(err); err != nil && code != connect.CodeDeadlineExceeded && code != connect.CodeCanceled {
			t.Fatalf("RecordUsage with a 1ms deadline: %v, want DeadlineExceeded", err)
		}
	}
	// An entitlement longer than any id, on a check: refused before the engine sees it.
	_, err = env.client("connect").CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/metered", Entitlement: strings.Repeat("e", 65)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "entitlement") {
		t.Errorf("a check naming an entitlement of 65 bytes: %v, want InvalidArgument naming entitlement", err)
	}
	hr, err := env.http.Post(env.url+"/quotaflow.v1.RateLimiter/RecordUsage", "application/json",
		strings.NewReader(`{"entitlement":"tokens","subject":"`+user+`","amount":"-3","eventId":"y"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Body.Close()
	var body strings.Builder
	_, _ = io.Copy(&body, hr.Body)
	if hr.StatusCode != http.StatusBadRequest || !strings.Contains(body.String(), "amount") {
		t.Errorf("HTTP/JSON with a negative amount: %s %s; want 400 naming amount", hr.Status, body.String())
	}
}
