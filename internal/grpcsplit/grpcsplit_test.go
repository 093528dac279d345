package grpcsplit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// splitEnv is a Splitter serving grpc-go's health service and an HTTP handler that counts its
// requests and answers with the protocol it was reached by.
type splitEnv struct {
	addr      string
	httpCalls atomic.Int64
	release   chan struct{} // ends the answers of POST /stream
}

func newSplitEnv(t *testing.T, cfg Config) *splitEnv {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveSplit(t, ln, cfg)
}

// serveSplit is newSplitEnv on a listener of the test's, with the servers made as the checker
// makes them (NewHTTPServer, GRPCServerOptions). Its handler reads the body of POST /read, and
// of POST /stream, whose answer then waits for release (or the request's end) and reports
// whether the request's context ended.
func serveSplit(t *testing.T, ln net.Listener, cfg Config) *splitEnv {
	t.Helper()
	e := &splitEnv{addr: ln.Addr().String(), release: make(chan struct{})}
	gs := grpc.NewServer(GRPCServerOptions(cfg)...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	hs := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.httpCalls.Add(1)
		if r.URL.Path == "/read" || r.URL.Path == "/stream" {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestTimeout)
				return
			}
		}
		if r.URL.Path == "/stream" {
			select {
			case <-e.release:
			case <-r.Context().Done():
			}
			fmt.Fprintf(w, "context: %v", r.Context().Err())
			return
		}
		fmt.Fprintf(w, "%s %s", r.Proto, r.Header.Get("Content-Type"))
	}), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, gs, hs, 5*time.Second, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

// client returns an HTTP client for HTTP/1.1 or h2c whose connections close when the test
// ends, before the servers stop (an idle h2c connection holds up Shutdown for a second).
func client(t *testing.T, h2c bool) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetHTTP1(!h2c)
	tr.Protocols.SetUnencryptedHTTP2(h2c)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

func TestGRPCClientsReachGRPC(t *testing.T) {
	t.Parallel()
	e := newSplitEnv(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// grpc-go waits for the server's SETTINGS before its first request.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range 3 {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("grpc-go call %d: %v", i, err)
		}
		if got := resp.GetStatus(); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("grpc-go call %d: status %v, want SERVING", i, got)
		}
	}

	// connect-go's gRPC client sends its request without waiting.
	client := connect.NewClient[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](
		client(t, true), "http://"+e.addr+"/grpc.health.v1.Health/Check", connect.WithGRPC())
	for i := range 3 {
		resp, err := client.CallUnary(ctx, connect.NewRequest(&healthpb.HealthCheckRequest{}))
		if err != nil {
			t.Fatalf("connect-go gRPC call %d: %v", i, err)
		}
		if got := resp.Msg.GetStatus(); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("connect-go gRPC call %d: status %v, want SERVING", i, got)
		}
	}
	if n := e.httpCalls.Load(); n != 0 {
		t.Errorf("the HTTP server got %d gRPC calls, want 0", n)
	}
}

func TestOtherConnectionsReachHTTP(t *testing.T) {
	t.Parallel()
	e := newSplitEnv(t, Config{})
	tests := []struct {
		name        string
		h2c         bool
		contentType string
		wantProto   string
	}{
		{"connect over h2c", true, "application/proto", "HTTP/2.0"},
		{"grpc-web over h2c", true, "application/grpc-web+proto", "HTTP/2.0"},
		{"grpc look-alike over h2c", true, "application/grpcx", "HTTP/2.0"},
		{"HTTP/1.1", false, "application/json", "HTTP/1.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Several requests on one connection: net/http would close it on the second
			// SETTINGS acknowledgement if the splitter's were not removed.
			c := client(t, tt.h2c)
			for i := range 3 {
				var reused bool
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
				})
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+e.addr+"/x", strings.NewReader("{}"))
				req.Header.Set("Content-Type", tt.contentType)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if i > 0 && !reused {
					t.Errorf("request %d went on a new connection: the server closed the first", i)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := tt.wantProto + " " + tt.contentType; string(body) != want {
					t.Errorf("request %d: got %q, want %q", i, body, want)
				}
			}
		})
	}
}

// TestShortHTTP1Request: a request shorter than the HTTP/2 preface is served without waiting
// for bytes that never come.
func TestShortHTTP1Request(t *testing.T) {
	t.Parallel()
	e := newSplitEnv(t, Config{SniffTimeout: time.Minute})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a short HTTP/1.0 request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(body), "HTTP/1.0") {
		t.Errorf("body %q, want the handler's HTTP/1.0 answer", body)
	}
}

// TestSilentConnectionClosed: a connection that shows no request within SniffTimeout is
// closed, with or without the HTTP/2 preface.
func TestSilentConnectionClosed(t *testing.T) {
	t.Parallel()
	e := newSplitEnv(t, Config{SniffTimeout: 100 * time.Millisecond})
	for _, sent := range []string{"", http2.ClientPreface, "PRI * HT"} {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, sent)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, c) // the splitter's SETTINGS, then EOF
		c.Close()
		if err != nil {
			t.Errorf("after sending %q: read: %v, want EOF once the splitter closes", sent, err)
		}
	}
}

func TestCloseStopsListeners(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sp := New(ln, Config{})
	served := make(chan error, 1)
	go func() { served <- sp.Serve() }()
	if err := sp.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Close = %v, want nil", err)
	}
	for name, l := range map[string]net.Listener{"GRPC": sp.GRPC(), "HTTP": sp.HTTP()} {
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s().Accept after Close = %v, want net.ErrClosed", name, err)
		}
	}
}

func TestAckFilter(t *testing.T) {
	t.Parallel()
	frame := func(typ http2.FrameType, flags http2.Flags, payload string) string {
		n := len(payload)
		return string([]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(typ), byte(flags), 0, 0, 0, 1}) + payload
	}
	ack := frame(http2.FrameSettings, http2.FlagSettingsAck, "")
	settings := frame(http2.FrameSettings, 0, "\x00\x04\x00\x01\x00\x00")
	headers := frame(http2.FrameHeaders, http2.FlagHeadersEndHeaders, strings.Repeat("h", 40))
	// A payload that looks like an acknowledgement must pass: only frame headers are read.
	data := frame(http2.FrameData, 0, ack)
	tests := []struct {
		name, in, want string
	}{
		{"ack first", http2.ClientPreface + ack + settings + headers + ack, http2.ClientPreface + settings + headers + ack},
		{"ack after a request", http2.ClientPreface + settings + headers + data + ack + ack, http2.ClientPreface + settings + headers + data + ack},
		{"no ack", http2.ClientPreface + settings + headers, http2.ClientPreface + settings + headers},
	}
	for _, tt := range tests {
		for _, oneByte := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/one byte reads %v", tt.name, oneByte), func(t *testing.T) {
				t.Parallel()
				var r io.Reader = strings.NewReader(tt.in)
				if oneByte {
					r = iotest.OneByteReader(r)
				}
				got, err := io.ReadAll(&ackFilter{r: r, pass: len(http2.ClientPreface)})
				if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatal(err)
				}
				if !bytes.Equal(got, []byte(tt.want)) {
					t.Errorf("got %q\nwant %q", got, tt.want)
				}
			})
		}
	}
}

// TestServeHTTP: a port of its own answers until its context ends, then shuts down cleanly.
func TestServeHTTP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ServeHTTP(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), time.Second, Config{})
	}()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Errorf("body %q, want ok", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeHTTP = %v, want nil after ctx ends", err)
	}
}

// TestServeStoppedBeforeServing: a shutdown that stops the gRPC server before its goroutine
// got to serve (a context done at once, a test that ends at once) is a clean stop, not the
// error grpc-go's Serve returns for a stopped server.
func TestServeStoppedBeforeServing(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	gs.Stop() // what the shutdown did first
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Serve(ctx, ln, gs, NewHTTPServer(http.NotFoundHandler(), Config{}), time.Second, Config{}); err != nil {
		t.Errorf("Serve: %v, want nil", err)
	}
}
