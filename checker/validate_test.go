package checker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{})
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
	env := newEnv(t, Config{})
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

func FuzzCheckRequest(f *testing.F) {
	f.Add("user-1", int32(1), "/api/v1/orders", int64(1), int64(0), "", "", "10.0.0.1", int32(2))
	f.Add("", int32(0), "", int64(-1), int64(1), "k", "premium", "", int32(4))
	f.Add("a\xff", int32(3), "/x\x00y", int64(1_000_001), int64(1<<62), "\xfe", "free", "b", int32(1))
	f.Add("{user:1}", int32(1), "*", int64(0), time.Now().UnixMilli(), "idem", "", "::1", int32(7))
	now := time.Now()
	f.Fuzz(func(t *testing.T, ident string, dim int32, endpoint string, cost, ts int64, idem, tier, other string, otherDim int32) {
		req := &quotaflowv1.CheckRateLimitRequest{Identifier: ident, Dimension: quotaflowv1.Dimension(dim), Endpoint: endpoint,
			Cost: cost, Timestamp: ts, IdempotencyKey: idem, Tier: tier}
		if other != "" {
			req.Subjects = []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension(otherDim), Identifier: other}}
		}
		q, err := newCheckQuery(req, now)
		if err != nil {
			if !isFieldError(err) {
				t.Fatalf("error %v is not a FieldError", err)
			}
			return
		}
		if len(q.subjects) == 0 || q.cost < 1 || q.cost > MaxCost || !utf8.ValidString(q.endpoint) || len(q.endpoint) > MaxEndpointLen {
			t.Fatalf("accepted an invalid request: %+v", q)
		}
		seen := map[any]bool{}
		for _, s := range q.subjects {
			if s.id == "" || len(s.id) > MaxIdentifierLen || !utf8.ValidString(s.id) || !s.dim.Valid() || seen[s.dim] {
				t.Fatalf("accepted an invalid subject: %+v", s)
			}
			seen[s.dim] = true
			// Whatever the identifier holds, its key stays inside its own hash tag.
			tag := subjectTag(s.dim, s.id)
			if strings.Count(tag, "{") != 1 || strings.Count(tag, "}") != 1 || strings.ContainsAny(tag[1:len(tag)-1], "{}") {
				t.Fatalf("subject %q escapes its hash tag: %q", s.id, tag)
			}
		}
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	set := mustRules(t, testRules)
	r, _ := set.Rule("user-api")
	tests := []struct{ id, want string }{
		{"12345", "rl:{user:12345}:tb:1h:/api/*"},
		{"a}:tb:1h:/x", "rl:{user:a%7D%3Atb%3A1h%3A/x}:tb:1h:/api/*"},
		{"{user:1}", "rl:{user:%7Buser%3A1%7D}:tb:1h:/api/*"},
		{"ünï cödé", "rl:{user:%C3%BCn%C3%AF%20c%C3%B6d%C3%A9}:tb:1h:/api/*"},
	}
	for _, tt := range tests {
		if got := limitKey(subjectTag(r.Dimension, tt.id), r); got != tt.want {
			t.Errorf("key for %q = %q, want %q", tt.id, got, tt.want)
		}
	}
	for d, want := range map[time.Duration]string{time.Second: "1s", 90 * time.Second: "90s", time.Minute: "1m",
		2 * time.Hour: "2h", 24 * time.Hour: "1d", 1500 * time.Millisecond: "1500ms"} {
		if got := windowToken(d); got != want {
			t.Errorf("windowToken(%s) = %q, want %q", d, got, want)
		}
	}
}
