package transport

import (
	"context"
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
