package transport

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
)

// rawGet sends GET target to the server at base with the request line exactly as given (an
// HTTP client would clean or escape some of the spellings) and reads the answer.
func rawGet(t *testing.T, base, target, user string) (*http.Response, string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%s: %s\r\nConnection: close\r\n\r\n", target, u.Host, testUserHeader, user); err != nil {
		t.Fatalf("send GET %s: %v", target, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer to GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer to GET %s: %v", target, err)
	}
	return resp, string(b)
}

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
				resp, body := rawGet(t, gw.url, path, user)
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
