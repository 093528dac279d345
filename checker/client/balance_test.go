package client_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/checker/rules"
)

// TestBalance: a subject's balance through the client, over Connect and gRPC, retried past a
// connection that broke; an unknown entitlement is the checker's NotFound.
func TestBalance(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	user := fmt.Sprintf("balance-%d", time.Now().UnixNano()) // one of its own per run (-count)
	if _, _, err := chk.engine.PutGrant(context.Background(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 1000, Reason: "plan"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []client.Protocol{client.Connect, client.GRPC} {
		c := client.New(chk.url(), client.Config{Protocol: p, Timeout: testTimeout})
		t.Cleanup(c.Close)
		chk.failNext.Store(p == client.Connect)
		b, err := c.Balance(context.Background(), "tokens", user)
		if err != nil || b.Remaining != 1000 || len(b.Grants) != 1 || b.Grants[0].Reason != "plan" {
			t.Fatalf("%v: Balance = %v, %v; want 1000 left in one grant", p, b, err)
		}
		if _, err := c.Balance(context.Background(), "gold", user); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%v: an unknown entitlement: %v, want NotFound", p, err)
		}
	}
}

// TestCheckBurnsBalance: a check naming an entitlement burns its balance; the denial of an
// empty balance is not cached by the deny cache (its retry is the period's end, a grant may
// come at any time), so that the check after a top-up is allowed at once.
func TestCheckBurnsBalance(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	t.Cleanup(c.Close)
	user := fmt.Sprintf("burn-%d", time.Now().UnixNano())
	grant := func(amount int64) {
		t.Helper()
		if _, _, err := chk.engine.PutGrant(context.Background(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: amount, Reason: "plan"}); err != nil {
			t.Fatal(err)
		}
	}
	grant(5)
	req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: user}}, Endpoint: "/llm", Cost: 5, Entitlement: "tokens"}
	if d, err := c.Check(context.Background(), req); err != nil || !d.Allowed || d.RuleID != "tokens" || d.Remaining != 0 {
		t.Fatalf("burning 5 of 5: %+v, %v", d, err)
	}
	if d, err := c.Check(context.Background(), req); err != nil || d.Allowed || d.Source != client.SourceChecker {
		t.Fatalf("a check of an empty balance: %+v, %v; want the checker's denial", d, err)
	}
	grant(5)
	if d, err := c.Check(context.Background(), req); err != nil || !d.Allowed || d.Source != client.SourceChecker {
		t.Fatalf("after a top-up: %+v, %v; want allowed by the checker, not a cached denial", d, err)
	}
}

// TestRecordUsage: usage through the client burns once, across a connection that broke after
// the checker burned (the retry carries the same event id).
func TestRecordUsage(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	t.Cleanup(c.Close)
	user := fmt.Sprintf("usage-%d", time.Now().UnixNano())
	if _, _, err := chk.engine.PutGrant(context.Background(), rules.Grant{Entitlement: "tokens", Subject: user, Amount: 100, Reason: "plan"}); err != nil {
		t.Fatal(err)
	}
	chk.failNext.Store(true)
	r, err := c.RecordUsage(context.Background(), client.Usage{Entitlement: "tokens", Subject: user, Amount: 30})
	if err != nil || r.Taken != 30 || r.Balance.Remaining != 70 || !r.Replayed {
		t.Fatalf("RecordUsage of 30 across a broken connection = %v, %v; want 70 left, the retry replayed", r, err)
	}
	_, err = c.RecordUsage(context.Background(), client.Usage{Entitlement: "tokens", Subject: user})
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "amount") {
		t.Errorf("a use of nothing: %v, want InvalidArgument naming amount", err)
	}
}
