package transport

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestAuthLockoutSource: failed authentications count against the connection's address, and
// against the client a trusted proxy names only when the proxy is trusted — an untrusted one
// cannot make its clients' failures somebody else's — and an IPv6 client's against its /64.
func TestAuthLockoutSource(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		trusted []netip.Prefix
		guesser string // X-Forwarded-For of the wrong guesses
		// what the right token gets afterwards, by X-Forwarded-For
		want map[string]int
	}{
		{"trusted proxy: per client", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "203.0.113.1",
			map[string]int{"203.0.113.1": http.StatusTooManyRequests, "203.0.113.2": http.StatusOK}},
		{"trusted proxy: an IPv6 client is its /64", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "2001:db8:1::1",
			map[string]int{"2001:db8:1::99": http.StatusTooManyRequests, "2001:db8:1:0:ffff::1%eth0": http.StatusTooManyRequests, "2001:db8:2::1": http.StatusOK}},
		{"untrusted proxy: the connection", nil, "203.0.113.1",
			map[string]int{"203.0.113.1": http.StatusTooManyRequests, "203.0.113.2": http.StatusTooManyRequests}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, rdb := ownRedis(t) // 127.0.0.1's failures are the test's own
			engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(t, trustRules), RedisTimeout: loadedTimeout})
			t.Cleanup(func() { engine.Close() })
			reg := new(auth.Registry)
			if err := reg.Load([]byte("callers: [{name: orders, token: " + serviceToken + ", permissions: [check]}]\n")); err != nil {
				t.Fatal(err)
			}
			fa := ForwardAuthConfig{TrustedProxies: tt.trusted}
			lock := auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: 3, TrustedProxies: tt.trusted})
			srv := New(engine, Config{Callers: reg, ForwardAuth: fa, Lockout: lock})
			env := &testEnv{engine: engine, srv: srv, url: checkertest.Serve(t, srv.Handler(), srv.RegisterGRPC), http: checkertest.HTTPClient()}
			call := func(xff, token string) int {
				resp, _ := getForwardAuth(t, env, map[string]string{"X-Forwarded-For": xff, "Authorization": "Bearer " + token,
					"X-User-Id": id(t, "u"), "X-Forwarded-Uri": "/api/x"}, "")
				return resp.StatusCode
			}
			for i := range 3 {
				if got := call(tt.guesser, "wrong-token-of-nobody"); got != http.StatusUnauthorized {
					t.Fatalf("guess %d = %d, want 401", i+1, got)
				}
			}
			for xff, want := range tt.want {
				if got := call(xff, serviceToken); got != want {
					t.Errorf("the right token from %s = %d, want %d", xff, got, want)
				}
			}
		})
	}
}
