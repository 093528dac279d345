package client_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestNewRPC: the one client builder speaks each protocol to a checker (a limit of 3 allows 3
// and denies the 4th), and sends its token on every call: this checker has no callers file, so
// a token it does not know is refused as unauthenticated.
func TestNewRPC(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	for _, tt := range []struct {
		name     string
		protocol client.Protocol
	}{
		{"connect", client.Connect}, {"grpc", client.GRPC}, {"grpc-web", client.GRPCWeb},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rpc := client.NewRPC(chk.url()+"/", client.RPCConfig{Protocol: tt.protocol})
			req := &quotaflowv1.CheckRateLimitRequest{Identifier: checkertest.ID(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders"}
			for i, want := range []bool{true, true, true, false} {
				resp, err := rpc.CheckRateLimit(ctx, connect.NewRequest(req))
				if err != nil {
					t.Fatalf("check %d: %v", i+1, err)
				}
				if resp.Msg.Allowed != want {
					t.Errorf("check %d: allowed %v, want %v", i+1, resp.Msg.Allowed, want)
				}
			}
			withToken := client.NewRPC(chk.url(), client.RPCConfig{Protocol: tt.protocol, Token: "unknown-token"})
			if _, err := withToken.CheckRateLimit(ctx, connect.NewRequest(req)); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("check with an unknown token: %v; want Unauthenticated (the token sent)", err)
			}
		})
	}
}
