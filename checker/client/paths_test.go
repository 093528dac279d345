package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestMiddlewarePathSpellings: behind the middleware, every spelling of /api/v1/search is
// counted in user-search's bucket, one unit after the other; a path no limit can count is
// answered 400 and never reaches the service.
func TestMiddlewarePathSpellings(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	var served atomic.Int64
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Write([]byte("ok"))
	})))
	defer svc.Close()
	u := user(t, "u")
	for i, path := range append([]string{"/api/v1/search"}, checkertest.SearchSpellings...) {
		resp, body := checkertest.RawGet(t, svc.URL, path, map[string]string{"X-User": u})
		want := strconv.Itoa(99 - i)
		if resp.StatusCode != http.StatusOK || body != "ok" || !strings.HasPrefix(resp.Header.Get("RateLimit-Policy"), `"user-search";`) ||
			resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Errorf("GET %s = %d %q, RateLimit-Policy %q, X-RateLimit-Remaining %q; want 200 with user-search, %s left",
				path, resp.StatusCode, body, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	before := served.Load()
	for _, path := range []string{"/api/v1/a%2Fsearch", "/../api/v1/search", "/api/v1/search%00", "/api/v1/search%5C"} {
		if resp, body := checkertest.RawGet(t, svc.URL, path, map[string]string{"X-User": u}); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "path") {
			t.Errorf("GET %s = %d %q, want 400 saying what is wrong with the path", path, resp.StatusCode, body)
		}
	}
	if n := served.Load() - before; n != 0 {
		t.Errorf("the service served %d refused paths, want none", n)
	}
}

// TestCheckEndpointNormalForm: the client keys its deny cache on the endpoint's normal form, as
// the checker matches it, so that another spelling of a denied path is denied from the cache;
// an endpoint that is no path is refused before it is sent.
func TestCheckEndpointNormalForm(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	ctx := context.Background()
	u := user(t, "u")
	check := func(endpoint string) (client.Decision, error) {
		return c.Check(ctx, client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: u}}, Endpoint: endpoint})
	}
	for i := range 4 { // user-orders allows 3
		if _, err := check("/orders"); err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
	}
	calls := chk.calls.Load()
	for _, ep := range []string{"/orders", "/ORDERS/", "//orders;x", "/%6Frders"} {
		if d, err := check(ep); err != nil || d.Allowed || d.Source != client.SourceDenyCache {
			t.Errorf("Check(%q) = %+v, %v; want denied from the deny cache", ep, d, err)
		}
	}
	for _, ep := range []string{"orders", "/a%2Fb", "/../orders", ""} {
		if _, err := check(ep); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "endpoint") {
			t.Errorf("Check(%q) = %v, want InvalidArgument naming endpoint", ep, err)
		}
	}
	if got := chk.calls.Load(); got != calls {
		t.Errorf("the checker got %d calls, want none: cached denials and refused endpoints", got-calls)
	}
}
