package transport

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestGatewayPathSpellings runs each gateway with the repository's config in front of a real
// checker: every spelling of /api/v1/search that the gateway passes to the app is counted in
// user-search's bucket, one unit after the other, as the canonical path is. nginx, Caddy and
// HAProxy send the request target as the client wrote it ($request_uri, {http.request.uri},
// pathq), which the checker normalises.
func TestGatewayPathSpellings(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, pathRules)})
	u, err := url.Parse(env.url)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range gatewayKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			a := newApp(t)
			gw := startGateway(t, kind, u.Host, a.addr(), "open")
			user := id(t, "u")
			for i, path := range append([]string{"/api/v1/search"}, searchSpellings...) {
				resp, body := checkertest.RawGet(t, gw.url, path, map[string]string{testUserHeader: user})
				if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "app ") {
					t.Errorf("GET %s = %d %q, want 200 from the app", path, resp.StatusCode, body)
					continue
				}
				want := strconv.Itoa(searchLimit - 1 - i)
				if got := resp.Header.Get("RateLimit-Policy"); !strings.HasPrefix(got, `"user-search";`) ||
					resp.Header.Get("X-RateLimit-Remaining") != want || resp.Header.Get("X-RateLimit-Degraded") != "" {
					t.Errorf("GET %s: RateLimit-Policy %q, X-RateLimit-Remaining %q, X-RateLimit-Degraded %q; want user-search with %s left, decided",
						path, got, resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("X-RateLimit-Degraded"), want)
				}
			}
		})
	}
}
