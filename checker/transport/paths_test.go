package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// pathRules are the dev rules' shape (deploy/dev/rules.yaml): a loose limit on /api/* and a
// tight one of its own on /api/v1/search, which no spelling of the path may escape.
const pathRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: user-api-minute, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 1000, window: 1h}
  - {id: user-search, dimension: user, endpoint: /api/v1/search, algorithm: sliding_window_log, limit: 100, window: 1h}
`

// searchLimit is user-search's limit: each spelling's check must leave one unit less.
const searchLimit = 100

var searchSpellings = checkertest.SearchSpellings

// badPaths are paths no limit can count: each is refused naming its field.
var badPaths = []string{"/api/v1/a%2Fsearch", "/../api/v1/search", "/api/v1/search%00", "api/v1/search", `/api\v1\search`}

// verdict is what a check answered about the limit that decided it.
type verdict struct {
	rule      string
	remaining int64
}

// spellingProtocol sends one check of user on path the way one entry point takes it.
type spellingProtocol struct {
	name  string
	field string // the field a refusal names
	check func(t *testing.T, env *rlsEnv, user, path string) (verdict, error)
}

func rpcSpelling(protocol string) spellingProtocol {
	return spellingProtocol{protocol, "endpoint", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		resp, err := env.testEnv.client(protocol).CheckRateLimit(context.Background(), checkReq(user, path))
		if err != nil {
			return verdict{}, err
		}
		return verdict{resp.Msg.RuleId, resp.Msg.Remaining}, nil
	}}
}

var spellingProtocols = []spellingProtocol{
	rpcSpelling("connect"),
	rpcSpelling("grpc"),
	rpcSpelling("grpcweb"),
	{"http-json", "endpoint", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		body, err := protojson.Marshal(&quotaflowv1.CheckRateLimitRequest{Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: path})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := env.http.Post(env.url+quotaflowv1connect.RateLimiterCheckRateLimitProcedure, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			var e struct{ Code, Message string }
			var code connect.Code
			if err := json.Unmarshal(b, &e); err != nil || code.UnmarshalText([]byte(e.Code)) != nil {
				t.Fatalf("error answer %s %s: want Connect's JSON error", resp.Status, b)
			}
			return verdict{}, connect.NewError(code, errors.New(e.Message))
		}
		var m quotaflowv1.CheckRateLimitResponse
		if err := protojson.Unmarshal(b, &m); err != nil {
			t.Fatalf("answer %s: %v", b, err)
		}
		return verdict{m.RuleId, m.Remaining}, nil
	}},
	{"batch", "checks[0].endpoint", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		resp, err := env.testEnv.client("connect").CheckRateLimits(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitsRequest{
			Checks: []*quotaflowv1.CheckRateLimitRequest{checkReq(user, path).Msg}}))
		if err != nil {
			t.Fatal(err)
		}
		res := resp.Msg.Results[0]
		if e := res.GetError(); e != nil {
			return verdict{}, connect.NewError(connect.Code(e.Code), errors.New(e.Message))
		}
		return verdict{res.GetResponse().RuleId, res.GetResponse().Remaining}, nil
	}},
	{"rls-path", "descriptors[0].entries[1].value", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		return rlsSpelling(t, env, &ratelimitv3.RateLimitRequest{Domain: "quotaflow", Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("user_id", user, "path", path)}})
	}},
	{"rls-endpoint", "descriptors[0].entries[1].value", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		return rlsSpelling(t, env, &ratelimitv3.RateLimitRequest{Domain: "quotaflow", Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("user_id", user, "endpoint", path)}})
	}},
	{"rls-domain", "domain", func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		// Without a path entry the endpoint is "/" + domain.
		domain, ok := strings.CutPrefix(path, "/")
		if !ok {
			domain = "../" + path // a path not starting with "/" has no domain form: this one climbs out
		}
		return rlsSpelling(t, env, &ratelimitv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("user_id", user)}})
	}},
	forwardAuthSpelling("X-Forwarded-Uri", func(h map[string]string, path string) string {
		h["X-Forwarded-Uri"] = path
		return ""
	}),
	forwardAuthSpelling("X-Original-URI", func(h map[string]string, path string) string {
		h["X-Original-URI"] = path
		return ""
	}),
	forwardAuthSpelling("endpoint", func(h map[string]string, path string) string {
		return "?endpoint=" + url.QueryEscape(path)
	}),
}

func rlsSpelling(t *testing.T, env *rlsEnv, req *ratelimitv3.RateLimitRequest) (verdict, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := env.client.ShouldRateLimit(ctx, req)
	if err != nil {
		if s, ok := status.FromError(err); ok {
			return verdict{}, connect.NewError(connect.Code(s.Code()), errors.New(s.Message()))
		}
		return verdict{}, err
	}
	// A path quotaflow refuses is a denial carrying the error, since Envoy serves a request on
	// an error (TestRLSRefusesPathAsDenial): the error it carries is the refusal.
	var refusal struct{ Error, Message string }
	if resp.OverallCode == ratelimitv3.RateLimitResponse_OVER_LIMIT && json.Unmarshal(resp.RawBody, &refusal) == nil && refusal.Error == "invalid_argument" {
		return verdict{}, connect.NewError(connect.CodeInvalidArgument, errors.New(refusal.Message))
	}
	st := resp.Statuses[0]
	return verdict{st.GetCurrentLimit().GetName(), int64(st.LimitRemaining)}, nil
}

var ruleNameRE = regexp.MustCompile(`^"([^"]+)";r=\d+;t=\d+$`)

// forwardAuthSpelling sends the path in the header (or query parameter) name; set puts it on
// the request's headers or returns the query string.
func forwardAuthSpelling(name string, set func(h map[string]string, path string) string) spellingProtocol {
	return spellingProtocol{"forward-auth/" + name, name, func(t *testing.T, env *rlsEnv, user, path string) (verdict, error) {
		h := map[string]string{"X-User-Id": user}
		resp, body := getForwardAuth(t, env.testEnv, h, set(h, path))
		if resp.StatusCode != http.StatusOK {
			return verdict{}, connect.NewError(connect.CodeInvalidArgument, errors.New(resp.Status+": "+body["message"].(string)))
		}
		m := ruleNameRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
		if m == nil {
			return verdict{}, nil // no rule matched
		}
		n, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Remaining"), 10, 64)
		if err != nil {
			t.Fatalf("X-RateLimit-Remaining = %q", resp.Header.Get("X-RateLimit-Remaining"))
		}
		return verdict{m[1], n}, nil
	}}
}

// TestEndpointSpellings: on every entry point, each spelling of /api/v1/search is counted in
// user-search's bucket, one unit after the other, as the canonical path is.
func TestEndpointSpellings(t *testing.T) {
	t.Parallel()
	env := newRLSEnv(t, checker.Config{Rules: mustRules(t, pathRules)})
	for _, p := range spellingProtocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			user := id(t, "u")
			for i, path := range append([]string{"/api/v1/search"}, searchSpellings...) {
				got, err := p.check(t, env, user, path)
				if want := (verdict{"user-search", searchLimit - 1 - int64(i)}); err != nil || got != want {
					t.Errorf("check %d, %q = %+v, %v; want %+v: the bucket of /api/v1/search", i+1, path, got, err, want)
				}
			}
		})
	}
	t.Run("quota", func(t *testing.T) {
		t.Parallel()
		user := id(t, "u")
		if got, err := rpcSpelling("connect").check(t, env, user, "/api/v1/search"); err != nil || got.remaining != searchLimit-1 {
			t.Fatalf("check = %+v, %v; want %d left", got, err, searchLimit-1)
		}
		for _, path := range searchSpellings {
			resp, err := env.testEnv.client("connect").GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
				Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: path}))
			if err != nil {
				t.Fatalf("GetRemainingQuota(%q): %v", path, err)
			}
			if l := resp.Msg.Limits; len(l) != 1 || l[0].RuleId != "user-search" || l[0].Remaining != searchLimit-1 {
				t.Errorf("GetRemainingQuota(%q) = %v, want user-search with %d left", path, l, searchLimit-1)
			}
		}
	})
}

// TestEndpointRefused: on every entry point, a path no limit can count is refused as the
// client's bad input (InvalidArgument, HTTP 400) naming the field it came in.
func TestEndpointRefused(t *testing.T) {
	t.Parallel()
	env := newRLSEnv(t, checker.Config{Rules: mustRules(t, pathRules)})
	for _, p := range spellingProtocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			user := id(t, "u")
			for _, path := range badPaths {
				got, err := p.check(t, env, user, path)
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), p.field+": ") {
					t.Errorf("check of %q = %+v, %v; want InvalidArgument naming %s", path, got, err, p.field)
				}
			}
		})
	}
}

// TestResetEndpointSpelling: ResetLimit's endpoint is normalised as a check's is, so that a
// spelling resets the path's own rules.
func TestResetEndpointSpelling(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{Rules: mustRules(t, pathRules)})
	user := id(t, "u")
	c := env.client("connect")
	for _, path := range searchSpellings[:3] {
		mustCheck(t, c, checkReq(user, path))
	}
	resp, err := c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/API/v1/search/"}))
	if err != nil {
		t.Fatal(err)
	}
	if ids := resp.Msg.RuleIds; len(ids) != 1 || ids[0] != "user-search" {
		t.Errorf("ResetLimit(/API/v1/search/) reset %v, want [user-search]", ids)
	}
	if got := mustCheck(t, c, checkReq(user, "/api/v1/search")); got.RuleId != "user-search" || got.Remaining != searchLimit-1 {
		t.Errorf("check after the reset = %s, %d left; want user-search, %d", got.RuleId, got.Remaining, searchLimit-1)
	}
	_, err = c.ResetLimit(context.Background(), connect.NewRequest(&quotaflowv1.ResetLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/a%2Fb"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "endpoint: ") {
		t.Errorf("ResetLimit(/a%%2Fb) = %v, want InvalidArgument naming endpoint", err)
	}
}
