package transport

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// limitEnv serves a checker whose callers need a token, with a small request bound, behind a
// handler that counts the body bytes the server's handlers read.
type limitEnv struct {
	url  string
	read atomic.Int64 // body bytes read by Handler's stack, over every request
}

const testMaxBody = 64 << 10

func newLimitEnv(t *testing.T) *limitEnv {
	t.Helper()
	callers := new(auth.Registry)
	if err := callers.Load([]byte("callers:\n  - {name: app, token: the-right-token-0123, permissions: [check]}\n")); err != nil {
		t.Fatal(err)
	}
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(t, testRules), Logger: checkertest.Logger(), RedisTimeout: loadedTimeout})
	t.Cleanup(func() { engine.Close() })
	srv := New(engine, Config{Callers: callers, MaxRequestBytes: testMaxBody, Logger: checkertest.Logger()})
	e := &limitEnv{}
	h := srv.Handler()
	e.url = serve(t, srv, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &countingReader{r: r.Body, n: &e.read}
		h.ServeHTTP(w, r)
	}))
	return e
}

// serve runs srv.Serve with h on a loopback port until the test ends and returns its URL.
func serve(t *testing.T, srv *Server, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, h, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

type countingReader struct {
	r io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// jsonFlood is a CheckRateLimit request in JSON whose identifier runs on for size bytes,
// produced as it is read: the client holds none of it in memory.
func jsonFlood(size int64) io.Reader {
	head := `{"identifier":"`
	return io.MultiReader(strings.NewReader(head), io.LimitReader(repeatByte('a'), size-int64(len(head))-2), strings.NewReader(`"}`))
}

type repeatByte byte

func (b repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// gzipBomb is a CheckRateLimit request in JSON padded with inflated spaces to size bytes,
// gzipped: about a thousandth of size on the wire.
func gzipBomb(t *testing.T, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	io.WriteString(zw, `{"identifier":"u",`)
	if _, err := io.Copy(zw, io.LimitReader(repeatByte(' '), size)); err != nil {
		t.Fatal(err)
	}
	io.WriteString(zw, `"endpoint":"/orders"}`)
	zw.Close()
	return buf.Bytes()
}

// connectCode is the code of a Connect unary error body ("" when there is none).
func connectCode(body []byte) string {
	var e struct{ Code string }
	json.Unmarshal(body, &e)
	return e.Code
}

// TestOversizedBodies: bodies over Config.MaxRequestBytes, sent with a wrong token, are refused
// with ResourceExhausted (Connect's HTTP 429, gRPC status 8) or 413 before any credential is
// looked at, and the server reads at most the bound of them — a declared Content-Length over
// it, none at all. On gzip, at most the bound is inflated.
func TestOversizedBodies(t *testing.T) {
	e := newLimitEnv(t)
	const flood = 32 << 20 // 512 times the bound
	check := e.url + quotaflowv1connect.RateLimiterCheckRateLimitProcedure
	bomb := gzipBomb(t, flood)
	envelope := make([]byte, 5)
	binary.BigEndian.PutUint32(envelope[1:], flood)
	tests := []struct {
		name        string
		url         string
		contentType string
		encoding    string
		body        func() io.Reader
		length      int64 // -1: chunked
		wantStatus  int
		wantCode    string // Connect's code in the body, or the gRPC status in Grpc-Status
		maxRead     int64
	}{
		{"connect declared", check, "application/json", "", func() io.Reader { return jsonFlood(flood) }, flood, 429, "resource_exhausted", 0},
		{"connect chunked", check, "application/json", "", func() io.Reader { return jsonFlood(flood) }, -1, 429, "resource_exhausted", testMaxBody + 1},
		{"connect gzip bomb", check, "application/json", "gzip", func() io.Reader { return bytes.NewReader(bomb) }, int64(len(bomb)), 429, "resource_exhausted", int64(len(bomb))},
		{"grpc-web chunked", check, "application/grpc-web+proto", "", func() io.Reader {
			return io.MultiReader(bytes.NewReader(envelope), io.LimitReader(repeatByte(0), flood))
		}, -1, 200, "8", testMaxBody + 1},
		{"forward-auth declared", e.url + "/ratelimit/check", "text/plain", "", func() io.Reader { return jsonFlood(flood) }, flood, 413, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.read.Load()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			allocBefore := ms.TotalAlloc
			req, err := http.NewRequest(http.MethodPost, tt.url, tt.body())
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = tt.length
			req.Header.Set("Content-Type", tt.contentType)
			req.Header.Set("Authorization", "Bearer wrong-token")
			if tt.encoding != "" {
				req.Header.Set("Content-Encoding", tt.encoding)
			}
			if strings.HasPrefix(tt.contentType, "application/grpc-web") {
				req.Header.Set("X-Grpc-Web", "1")
			}
			resp, err := checkertest.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code := connectCode(body)
			if strings.HasPrefix(tt.contentType, "application/grpc") {
				code = resp.Header.Get("Grpc-Status")
				if code == "" {
					code = grpcWebTrailer(body, "grpc-status")
				}
			}
			if resp.StatusCode != tt.wantStatus || code != tt.wantCode {
				t.Errorf("got HTTP %d, code %q (%s); want HTTP %d, code %q", resp.StatusCode, code, body, tt.wantStatus, tt.wantCode)
			}
			if read := e.read.Load() - before; read > tt.maxRead {
				t.Errorf("the server read %d bytes of a %d-byte body, want at most %d", read, flood, tt.maxRead)
			}
			runtime.ReadMemStats(&ms)
			// A sanity bound, not a measure: the whole flood is 32 MiB.
			if alloc := ms.TotalAlloc - allocBefore; alloc > 16<<20 {
				t.Errorf("the request cost %d bytes of allocation, want far less than the %d-byte flood", alloc, flood)
			}
		})
	}

	// At the bound the request is read, and judged on its credentials.
	t.Run("at the bound", func(t *testing.T) {
		msg := `{"identifier":"u","endpoint":"/orders"}`
		body := msg[:len(msg)-1] + strings.Repeat(" ", testMaxBody-len(msg)) + "}"
		req, _ := http.NewRequest(http.MethodPost, check, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer wrong-token")
		resp, err := checkertest.HTTPClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := connectCode(b); resp.StatusCode != 401 || got != "unauthenticated" {
			t.Errorf("a %d-byte body: HTTP %d, code %q; want 401 unauthenticated", len(body), resp.StatusCode, got)
		}
	})
}

// grpcWebTrailer finds a trailer in a gRPC-Web response body.
func grpcWebTrailer(body []byte, name string) string {
	for len(body) >= 5 {
		n := int(binary.BigEndian.Uint32(body[1:5]))
		if len(body) < 5+n {
			break
		}
		if body[0]&0x80 != 0 {
			for _, line := range strings.Split(string(body[5:5+n]), "\r\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), name) {
					return strings.TrimSpace(v)
				}
			}
		}
		body = body[5+n:]
	}
	return ""
}

// TestBoundedGzip: the decompressor yields at most its bound plus one byte of a bomb, then
// fails, where gzip.Reader would inflate it all.
func TestBoundedGzip(t *testing.T) {
	t.Parallel()
	bomb := gzipBomb(t, 8<<20)
	for _, max := range []int64{0, 1, 4096, 1 << 20} {
		d := &boundedGzip{max: max}
		if err := d.Reset(bytes.NewReader(bomb)); err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, d)
		if n != max+1 || !errors.Is(err, errInflatedTooLarge) {
			t.Errorf("max %d: inflated %d bytes, err %v; want %d and errInflatedTooLarge", max, n, err, max+1)
		}
	}
	// A message within the bound inflates whole, and the decompressor is reusable.
	d := &boundedGzip{max: 9 << 20}
	for range 2 {
		if err := d.Reset(bytes.NewReader(bomb)); err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, d); err != nil || n <= 8<<20 {
			t.Errorf("within the bound: inflated %d bytes, err %v; want all of it", n, err)
		}
	}
}

// TestRequestBoundOverGRPC: grpc-go's bound is the same.
func TestRequestBoundOverGRPC(t *testing.T) {
	t.Parallel()
	e := newLimitEnv(t)
	hc := h2cClient()
	t.Cleanup(hc.CloseIdleConnections)
	client := quotaflowv1connect.NewRateLimiterClient(hc, e.url, connect.WithGRPC())
	_, err := client.CheckRateLimit(t.Context(), connect.NewRequest(userCheck(strings.Repeat("a", testMaxBody), "/orders", 1)))
	if got := connect.CodeOf(err); got != connect.CodeResourceExhausted {
		t.Errorf("a message over the bound over gRPC: %v (%v), want ResourceExhausted", got, err)
	}
}
