package client_test

import (
	"context"
	"fmt"
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
