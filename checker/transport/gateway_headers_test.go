package transport

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// headerRules limits a user on /orders (5 an hour, 50 on the premium tier), an API key on %[1]s
// and an address on %[2]s (3 an hour each). The key and address endpoints are the run's own:
// every gateway's client is 127.0.0.1.
const headerRules = `
default_tier: free
tiers: {free: {}, premium: {}}
rules:
  - {id: user-orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 5, window: 1h}
  - {id: user-orders-premium, dimension: user, endpoint: /orders, tier: premium, algorithm: fixed_window, limit: 50, window: 1h}
  - {id: key-keyed, dimension: apikey, endpoint: "%[1]s", algorithm: fixed_window, limit: 3, window: 1h}
  - {id: ip-addressed, dimension: ip, endpoint: "%[2]s", algorithm: fixed_window, limit: 3, window: 1h}
`

// forgery is a request a client sends again and again to get past its limit.
type forgery struct {
	name  string
	path  string // the endpoint, with the forged query if any
	limit int    // the limit the checker must hold the client to
	// headers are request i's: who the client is (the test gateway's stand-in for
	// authentication; id(t, ...) makes it the forgery's own) and what it forges.
	headers func(t *testing.T, i int) http.Header
}

// forgeries are the requests a client writes to slip past its limit: as an authenticated user
// on /orders, an authenticated API key on keyPath, the address 127.0.0.1 on ipPath. Before
// the configs stripped what the checker believes, the gateways read the subjects from the
// client's X-User-Id and X-Api-Key: an honest request carries those too, so that each forgery
// differs from it by the forged part alone.
func forgeries(keyPath, ipPath string) []forgery {
	honest := func(extra ...string) func(*testing.T, int) http.Header {
		return func(t *testing.T, _ int) http.Header {
			user := id(t, "user")
			h := http.Header{testUserHeader: {user}, "X-User-Id": {user}}
			for i := 0; i < len(extra); i += 2 {
				h.Set(extra[i], extra[i+1])
			}
			return h
		}
	}
	fresh := func(t *testing.T, i int) string { return id(t, "forged-"+strconv.Itoa(i)) }
	return []forgery{
		// A cost the checker refuses (over checker.MaxCost): nginx and HAProxy took the
		// checker's 400 for an outage and failed open.
		{"X-RateLimit-Cost", "/orders", 5, honest("X-RateLimit-Cost", "9999999")},
		{"cost query", "/orders?cost=9999999", 5, honest()},
		{"X-RateLimit-Tier", "/orders", 5, honest("X-RateLimit-Tier", "premium")},
		{"tier query", "/orders?tier=premium", 5, honest()},
		// One key on every request: the first decision, an allow, would be replayed.
		{"idempotency key", "/orders", 5, honest("X-Idempotency-Key", "retry-1", "Idempotency-Key", "retry-1")},
		{"X-User-Id", "/orders", 5, func(t *testing.T, i int) http.Header {
			return http.Header{testUserHeader: {id(t, "user")}, "X-User-Id": {fresh(t, i)}}
		}},
		{"X-Api-Key", keyPath, 3, func(t *testing.T, i int) http.Header {
			return http.Header{testAPIKeyHeader: {id(t, "key")}, "X-Api-Key": {fresh(t, i)}}
		}},
		// The gateway's client is in the checker's --trusted-proxies (loopback), as a client
		// in a trusted network is: its own X-Forwarded-For must not name its address.
		{"X-Forwarded-For", ipPath, 3, func(t *testing.T, i int) http.Header {
			ip := testIP(t, "forged-"+strconv.Itoa(i))
			return http.Header{"X-Forwarded-For": {ip}, "X-Real-Ip": {ip}, "X-Client-Ip": {ip}}
		}},
	}
}

// gatewayDo sends GET path with the headers to the gateway at base and reads the answer.
func gatewayDo(t *testing.T, base, path string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, vs := range h {
		req.Header[name] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer to GET %s: %v", path, err)
	}
	return resp, string(b)
}

// errorCode is the error member of a JSON answer, or "" when the body is not one.
func errorCode(body string) string {
	var v struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(body), &v) != nil {
		return ""
	}
	return v.Error
}

// runPath is an endpoint of the running test's own, lower-case (a path's spelling may be
// normalised), for rules whose buckets would be shared with other runs.
func runPath(t *testing.T, name string) string {
	return "/" + strings.ToLower(id(t, name))
}

// TestGatewayForgedHeaders sends each gateway, with the repository's config in front of a real
// checker, requests that forge what the checker believes (a cost, a tier, an idempotency key,
// the user, the API key, the address, in headers or in the query), each again and again: the
// client gets exactly its limit, then 429 denials; never a 500, never a request served
// unchecked.
func TestGatewayForgedHeaders(t *testing.T) {
	t.Parallel()
	for _, kind := range gatewayKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			keyPath, ipPath := runPath(t, "keyed"), runPath(t, "addressed")
			env := newEnv(t, checker.Config{Rules: mustRules(t, fmt.Sprintf(headerRules, keyPath, ipPath))})
			a := newApp(t)
			gw := startGateway(t, kind, hostOf(t, env.url), a.addr(), "open")
			// One after the other: each counts the app's hits.
			for _, f := range forgeries(keyPath, ipPath) {
				t.Run(f.name, func(t *testing.T) {
					before := a.hits.Load()
					allowed := 0
					for i := range f.limit + 3 {
						resp, body := gatewayDo(t, gw.url, f.path, f.headers(t, i))
						switch {
						case resp.StatusCode == http.StatusOK && strings.HasPrefix(body, "app ") && resp.Header.Get("X-RateLimit-Degraded") == "":
							allowed++
							if i >= f.limit {
								t.Errorf("request %d = 200 from the app, want 429: the limit is %d", i+1, f.limit)
							}
						case resp.StatusCode == http.StatusTooManyRequests && errorCode(body) == "rate_limit_exceeded":
							if i < f.limit {
								t.Errorf("request %d = 429, want 200: %d of %d allowed so far", i+1, allowed, f.limit)
							}
						default:
							t.Errorf("request %d = %d %q (X-RateLimit-Degraded %q), want 200 from the app (decided, not degraded) or a 429 denial",
								i+1, resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
						}
					}
					if got := a.hits.Load() - before; got != int64(f.limit) {
						t.Errorf("the app was reached %d times, want %d (the limit)", got, f.limit)
					}
				})
			}
		})
	}
}

// TestGatewayCheckerAnswers runs each gateway with the repository's config in front of a real
// checker that refuses the check or fails: a refusal (4xx) refuses the request whatever the
// fail mode, and only a failure (5xx) is the fail mode's to decide.
func TestGatewayCheckerAnswers(t *testing.T) {
	t.Parallel()
	for _, kind := range gatewayKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			t.Run("path the checker refuses", func(t *testing.T) {
				t.Parallel()
				env := newEnv(t, checker.Config{})
				a := newApp(t)
				gw := startGateway(t, kind, hostOf(t, env.url), a.addr(), "open")
				// Each is refused by the checker as bad input (400 naming X-Forwarded-Uri), sent
				// as the client wrote it (checkertest.RawGet: an HTTP client would escape some). A gateway
				// may refuse one itself first (nginx: the escaped NUL and the bad escape; Caddy:
				// the bad escape), with a 400 page of its own: refused all the same.
				for _, c := range []struct {
					path        string
					ownsRefusal bool // no gateway refuses it before the checker does
				}{
					{"/orders/" + strings.Repeat("a", checker.MaxEndpointLen), true}, // over the bound
					{"/api/v1/a%2Fb/search", true},                                   // an escaped slash
					{"/api/v1/%00search", false},                                     // an escaped control character
					{"/api/v1/%zzsearch", false},                                     // a bad escape
				} {
					resp, body := checkertest.RawGet(t, gw.url, c.path, map[string]string{testUserHeader: id(t, "user")})
					code := errorCode(body)
					if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-RateLimit-Degraded") != "" ||
						(code != "invalid_argument" && (c.ownsRefusal || code != "")) {
						t.Errorf("GET %.60s (%d bytes) = %d %q (X-RateLimit-Degraded %q), want 400 invalid_argument",
							c.path, len(c.path), resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
					}
				}
				if got := a.hits.Load(); got != 0 {
					t.Errorf("the app was reached %d times, want 0", got)
				}
			})
			t.Run("gateway not allowed to check", func(t *testing.T) {
				t.Parallel()
				callers := new(auth.Registry)
				if err := callers.Load([]byte("anonymous: {permissions: []}\n")); err != nil {
					t.Fatal(err)
				}
				env := newEnvWith(t, checker.Config{}, Config{Callers: callers})
				a := newApp(t)
				gw := startGateway(t, kind, hostOf(t, env.url), a.addr(), "open")
				resp, body := gatewayDo(t, gw.url, "/orders", http.Header{testUserHeader: {id(t, "user")}})
				if resp.StatusCode != http.StatusForbidden || errorCode(body) != "permission_denied" || resp.Header.Get("X-RateLimit-Degraded") != "" {
					t.Errorf("with the checker refusing the gateway = %d %q (X-RateLimit-Degraded %q), want 403 permission_denied",
						resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
				}
				if got := a.hits.Load(); got != 0 {
					t.Errorf("the app was reached %d times, want 0", got)
				}
			})
			t.Run("checker failing", func(t *testing.T) {
				t.Parallel()
				env := newEnv(t, checker.Config{})
				env.engine.SetRules(nil) // every check fails: 503 no rules loaded
				a := newApp(t)
				open := startGateway(t, kind, hostOf(t, env.url), a.addr(), "open")
				resp, body := gatewayDo(t, open.url, "/orders", http.Header{testUserHeader: {id(t, "user")}})
				if resp.StatusCode != http.StatusOK || body != "app /orders" || resp.Header.Get("X-RateLimit-Degraded") != "true" {
					t.Errorf("with the checker failing, failing open = %d %q (X-RateLimit-Degraded %q), want 200 from the app, degraded",
						resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
				}
				closed := startGateway(t, kind, hostOf(t, env.url), a.addr(), "closed")
				resp, body = gatewayDo(t, closed.url, "/orders", http.Header{testUserHeader: {id(t, "user")}})
				if resp.StatusCode != http.StatusServiceUnavailable || errorCode(body) != "rate_limiter_unavailable" || resp.Header.Get("X-RateLimit-Degraded") != "true" {
					t.Errorf("with the checker failing, failing closed = %d %q (X-RateLimit-Degraded %q), want 503 rate_limiter_unavailable, degraded",
						resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
				}
				if got := a.hits.Load(); got != 1 {
					t.Errorf("the app was reached %d times, want 1 (failing open only)", got)
				}
			})
		})
	}
}

// hostOf is the host:port of a URL.
func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
