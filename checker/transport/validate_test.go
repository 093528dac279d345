package transport

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	c := env.client("connect")
	user := quotaflowv1.Dimension_DIMENSION_USER
	tests := []struct {
		name      string
		req       *quotaflowv1.CheckRateLimitRequest
		wantField string
	}{
		{"no subject", &quotaflowv1.CheckRateLimitRequest{Endpoint: "/x"}, "identifier: required"},
		{"no dimension", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Endpoint: "/x"}, "dimension: required"},
		{"global subject", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: quotaflowv1.Dimension_DIMENSION_GLOBAL, Endpoint: "/x"}, "dimension: DIMENSION_GLOBAL cannot be named"},
		{"org subject", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: quotaflowv1.Dimension_DIMENSION_ORG, Endpoint: "/x"}, "dimension: DIMENSION_ORG cannot be named in a check"},
		{"unknown dimension", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: 42, Endpoint: "/x"}, "dimension: unknown dimension 42"},
		{"long identifier", &quotaflowv1.CheckRateLimitRequest{Identifier: strings.Repeat("a", 257), Dimension: user, Endpoint: "/x"}, "identifier: must be at most 256 bytes"},
		{"no endpoint", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user}, "endpoint: required"},
		{"long endpoint", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/" + strings.Repeat("e", 1024)}, "endpoint: must be at most 1024 bytes"},
		{"negative cost", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Cost: -1}, "cost: must not be negative"},
		{"absurd cost", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Cost: 1_000_001}, "cost: must be at most 1000000"},
		{"cost over burst", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/api/x", Cost: 5}, `cost: 5 is more than rule "user-api" can ever allow at once (4)`},
		{"future timestamp", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Timestamp: time.Now().Add(25 * time.Hour).UnixMilli()}, "timestamp:"},
		{"past timestamp", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Timestamp: 1}, "timestamp:"},
		{"unknown tier", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Tier: "gold"}, `tier: "gold" is not a configured tier`},
		{"long idempotency key", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", IdempotencyKey: strings.Repeat("k", 257)}, "idempotency_key: must be at most 256 bytes"},
		{"bad subject in list", &quotaflowv1.CheckRateLimitRequest{Endpoint: "/x", Subjects: []*quotaflowv1.Subject{{Dimension: user, Identifier: "a"}, {Dimension: quotaflowv1.Dimension_DIMENSION_IP}}}, "subjects[1].identifier: required"},
		{"two users", &quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Subjects: []*quotaflowv1.Subject{{Dimension: user, Identifier: "b"}}}, "subjects[0].dimension: the request names two user subjects"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.CheckRateLimit(context.Background(), connect.NewRequest(tt.req))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("err = %q, want it to contain %q", err, tt.wantField)
			}
		})
	}
}

// TestInvalidJSON: plain HTTP/JSON callers get 400 naming the field.
func TestInvalidJSON(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	tests := []struct{ body, want string }{
		{`{"identifier":"a","dimension":"DIMENSION_USER","endpoint":"/x","cost":-5}`, "cost: must not be negative"},
		{`{"identifier":"a","dimension":"DIMENSION_USER"}`, "endpoint: required"},
		{`{"identifier":"a","dimension":"DIMENSION_GLOBAL","endpoint":"/x"}`, "dimension: DIMENSION_GLOBAL cannot be named"},
		{"{\"identifier\":\"a\xffb\",\"dimension\":\"DIMENSION_USER\",\"endpoint\":\"/x\"}", "UTF-8"},
		{`{"identifier":"a","dimension":"DIMENSION_USER","endpoint":"/x","cost":"many"}`, "cost"},
	}
	for _, tt := range tests {
		resp, err := env.http.Post(env.url+"/quotaflow.v1.RateLimiter/CheckRateLimit", "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Code, Message string }
		json.Unmarshal(b, &e)
		if resp.StatusCode != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, tt.want) {
			t.Errorf("POST %s = %d %s, want 400 invalid_argument containing %q", tt.body, resp.StatusCode, b, tt.want)
		}
	}
}
