package transport

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestIPNetworksEveryProtocol: an IPv6 client is one bucket per /64 however its address
// arrives — the API's subjects over Connect and gRPC, Envoy's remote_address, forward-auth's
// client IP from X-Forwarded-For (zone and all) — so that three addresses of one /64 meet
// ip-api's limit of 2 (reported: each address was a bucket of its own).
func TestIPNetworksEveryProtocol(t *testing.T) {
	t.Parallel()
	rules := mustRules(t, testRules+"  - {id: rls-ip, dimension: ip, endpoint: /rls/*, algorithm: fixed_window, limit: 2, window: 1h}\n")
	env := newRLSEnv(t, checker.Config{Rules: rules})
	api := func(protocol string) func(t *testing.T, ip string) bool {
		return func(t *testing.T, ip string) bool {
			resp, err := env.testEnv.client(protocol).CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Endpoint: "/api/x", Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: ip}}}))
			if err != nil {
				t.Fatalf("CheckRateLimit(%s): %v", ip, err)
			}
			return resp.Msg.Allowed
		}
	}
	for _, tt := range []struct {
		name  string
		check func(t *testing.T, ip string) bool
	}{
		{"connect", api("connect")},
		{"grpc", api("grpc")},
		{"grpcweb", api("grpcweb")},
		{"rls", func(t *testing.T, ip string) bool {
			return env.should(t, rlsReq(desc("remote_address", ip, "path", "/rls/x"))).OverallCode == rlsOK
		}},
		{"forward-auth", func(t *testing.T, ip string) bool {
			resp, body := getForwardAuth(t, env.testEnv, map[string]string{"X-Forwarded-For": ip, "X-Forwarded-Uri": "/api/x"}, "")
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("forward-auth(%s) = %d %v", ip, resp.StatusCode, body)
			}
			return resp.StatusCode == http.StatusOK
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := fnv.New32a()
			h.Write([]byte(id(t, "net")))
			n := fmt.Sprintf("2001:db8:%x:%x", uint16(h.Sum32()), uint16(h.Sum32()>>16))
			for i, st := range []struct {
				ip      string
				allowed bool
			}{{n + "::1", true}, {n + ":ffff::2%eth0", true}, {n + ":0:0:0:3", false}, {n + "::1%25en1", false}} {
				if got := tt.check(t, st.ip); got != st.allowed {
					t.Errorf("check %d from %s: allowed %v, want %v", i, st.ip, got, st.allowed)
				}
			}
		})
	}
}
