package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/instance"
)

// exampleChecker serves a checker of testRules on the package's Redis, as `quotaflow checker`
// would: its URL, and a function stopping it.
func exampleChecker() (string, func()) {
	set, err := rules.Parse([]byte(testRules))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redisSrv.UniversalClient()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine := checker.New(checker.Config{Redis: rdb, Rules: set, RedisTimeout: 5 * time.Second, Logger: quiet})
	srv := transport.New(engine, transport.Config{Logger: quiet})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, ln, srv.Handler(), time.Second)
	}()
	return "http://" + ln.Addr().String(), func() {
		cancel()
		<-done
		engine.Close()
		rdb.Close()
	}
}

// A Client checks a limit of 3 orders an hour: the fourth is denied by the checker, the fifth
// by the deny cache, without a call.
func Example() {
	url, stop := exampleChecker()
	defer stop()
	// Connect, fail open, coalescing within 1 ms; a deadline generous for a loaded test machine.
	c := client.New(url, client.Config{Timeout: 5 * time.Second})
	defer c.Close()

	req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: "example-" + instance.NewID()}}, Endpoint: "/orders"}
	for range 5 {
		d, err := c.Check(context.Background(), req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v remaining=%d source=%s waits=%v\n", d.Allowed, d.Remaining, d.Source, d.RetryAfter > 0)
	}
	// Output:
	// allowed=true remaining=2 source=checker waits=false
	// allowed=true remaining=1 source=checker waits=false
	// allowed=true remaining=0 source=checker waits=false
	// allowed=false remaining=0 source=checker waits=true
	// allowed=false remaining=0 source=deny-cache waits=true
}

// When the checker cannot be reached the Client's fail mode decides, and says so.
func Example_failMode() {
	url, stop := exampleChecker()
	stop() // the checker is gone
	c := client.New(url, client.Config{FailMode: client.FailClosed, Retries: -1, Logger: slog.New(slog.DiscardHandler)})
	defer c.Close()

	d, err := c.Check(context.Background(), client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: "erin"}}, Endpoint: "/orders"})
	fmt.Println(d.Allowed, d.Degraded, d.Source, err)
	// Output:
	// false true fail-mode <nil>
}

// Middleware limits an HTTP service by the user an authentication middleware found and by
// the client's IP, believing X-Forwarded-For from the load balancers' network only.
func ExampleClient_Middleware() {
	url, stop := exampleChecker()
	defer stop()
	c := client.New(url, client.Config{Timeout: 5 * time.Second})
	defer c.Close()

	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ordered") })
	limited := c.Middleware(client.HTTPConfig{
		User: func(r *http.Request) string { return r.Header.Get("X-User") }, // your authentication's user
		IP:   client.ClientIP([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}),
	})(api)

	user := "example-" + instance.NewID()
	for range 4 {
		r := httptest.NewRequest(http.MethodPost, "/orders", nil)
		r.Header.Set("X-User", user)
		w := httptest.NewRecorder()
		limited.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "user-orders";q=3;w=3600
	// 200 "user-orders";q=3;w=3600
	// 200 "user-orders";q=3;w=3600
	// 429 "user-orders";q=3;w=3600
}

// ConnectInterceptor limits a connect-go service; a denied call gets ResourceExhausted with
// google.rpc.RetryInfo.
func ExampleClient_ConnectInterceptor() {
	c := client.New("http://checker:8080", client.Config{})
	defer c.Close()
	byKey := func(ctx context.Context, procedure string, h http.Header) client.Request {
		return client.Request{Subjects: []client.Subject{{Dimension: client.APIKey, ID: h.Get("X-Api-Key")}}}
	}
	opt := connect.WithInterceptors(c.ConnectInterceptor(byKey))
	_ = opt // pass to your service's NewXxxHandler(svc, opt)
	// Output:
}

// UnaryServerInterceptor and StreamServerInterceptor limit a grpc-go service.
func ExampleClient_UnaryServerInterceptor() {
	c := client.New("http://checker:8080", client.Config{Protocol: client.GRPC})
	defer c.Close()
	byKey := func(ctx context.Context, method string, h http.Header) client.Request {
		return client.Request{Subjects: []client.Subject{{Dimension: client.APIKey, ID: h.Get("X-Api-Key")}}}
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(c.UnaryServerInterceptor(byKey)), grpc.StreamInterceptor(c.StreamServerInterceptor(byKey)))
	defer gs.Stop()
	// Output:
}
