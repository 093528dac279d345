package bearer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

func TestToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header, want string
		ok           bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"Bearer   abc  ", "abc", true},
		{"Bearer a b", "a b", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer    ", "", false},
		{"Basic YWJjOmRlZg==", "", false},
		{"Bearerabc", "", false},
		{"abc", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			if got, ok := Token(tt.header); got != tt.want || ok != tt.ok {
				t.Errorf("Token(%q) = %q, %v; want %q, %v", tt.header, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestHeaderRoundTrip: what a client sends is what a server reads.
func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"abc", "s3cr3t-token_with.chars~", "a b"} {
		if got, ok := Token(Header(tok)); got != tok || !ok {
			t.Errorf("Token(Header(%q)) = %q, %v; want %q, true", tok, got, ok, tok)
		}
	}
}

// TestInterceptor: a Connect client with the interceptor sends the token on every call, as a
// server of the RateLimiter service receives it.
func TestInterceptor(t *testing.T) {
	t.Parallel()
	got := make(chan string, 2)
	_, h := quotaflowv1connect.NewRateLimiterHandler(quotaflowv1connect.UnimplementedRateLimiterHandler{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	c := quotaflowv1connect.NewRateLimiterClient(srv.Client(), srv.URL, connect.WithInterceptors(Interceptor("tok-1")))
	for range 2 {
		_, err := c.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{}))
		if connect.CodeOf(err) != connect.CodeUnimplemented {
			t.Fatalf("call: %v; want the server's Unimplemented", err)
		}
		if h := <-got; h != "Bearer tok-1" {
			t.Errorf("Authorization %q, want %q", h, "Bearer tok-1")
		}
	}
}
