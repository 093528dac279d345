package checkertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// SearchSpellings are forms of /api/v1/search that reached a looser bucket (/api/*), or no rule,
// before endpoints were normalised (issue 20, item 3), and more of the same kinds, each as a
// client would write it in a request line. Every one must be counted as /api/v1/search.
// internal/urlpath's own table has more.
var SearchSpellings = []string{
	"/api/v1/search/",
	"//api/v1/search",
	"/api//v1/search",
	"/api/v1/./search",
	"/api/v1/x/../search",
	"/api/v1/%73earch",
	"/api/v1/search;x",
	"/API/v1/search",
	"/%61pi/v1/search",
	"/x/../api/v1/search",
	"/api/v1/search?q=1",
	"/./api/v1/search/.",
	"/api/v1/x/%2E%2E/search",
	"/api/v1/x/..;/search",
	"/Api/V1/%53earch/",
}

// RawGet sends GET target to the server at base with the request line exactly as given (an
// HTTP client would clean or escape some spellings) and the header fields given, and returns
// the answer with its body read.
func RawGet(t testing.TB, base, target string, header map[string]string) (*http.Response, string) {
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
	var req strings.Builder
	fmt.Fprintf(&req, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", target, u.Host)
	for k, v := range header {
		fmt.Fprintf(&req, "%s: %s\r\n", k, v)
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(conn, req.String()); err != nil {
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
