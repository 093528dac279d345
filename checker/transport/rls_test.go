package transport

import (
	"bytes"
	"context"
	"go/build"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaflow/quotaflow/checker"
)

// rlsRules has a rule per status shape the RLS mapping renders.
const rlsRules = `
default_tier: free
tiers: {free: {}, gold: {}}
users:
  goldie: {tier: gold}
rules:
  - {id: rls-user, dimension: user, endpoint: /rls/*, algorithm: fixed_window, limit: 3, window: 1m}
  - {id: rls-user-gold, dimension: user, endpoint: /rls/*, tier: gold, algorithm: fixed_window, limit: 100, window: 1h}
  - {id: rls-ip, dimension: ip, endpoint: /quotaflow, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: rls-key, dimension: apikey, endpoint: "*", algorithm: token_bucket, limit: 10, window: 10s, burst: 5}
  - {id: rls-2h, dimension: user, endpoint: /2h, algorithm: fixed_window, limit: 7, window: 2h}
  - {id: rls-7d, dimension: user, endpoint: /7d, algorithm: fixed_window, limit: 70, window: 168h}
  - {id: rls-fast, dimension: user, endpoint: /fast, algorithm: gcra, limit: 2, window: 200ms}
  - {id: rls-shadow, dimension: user, endpoint: /shadow, algorithm: fixed_window, limit: 1, window: 1h, shadow: true}
  - {id: rls-open, dimension: user, endpoint: /open, algorithm: fixed_window, limit: 1, window: 1h}
  - {id: rls-closed, dimension: user, endpoint: /closed, algorithm: fixed_window, limit: 1, window: 1h, fail_mode: closed}
`

// rlsEnv is a checker with a go-control-plane RLS client, as Envoy would call it.
type rlsEnv struct {
	*testEnv
	client ratelimitv3.RateLimitServiceClient
}

func newRLSEnv(t *testing.T, cfg checker.Config) *rlsEnv {
	t.Helper()
	if cfg.Rules == nil {
		cfg.Rules = mustRules(t, rlsRules)
	}
	env := newEnv(t, cfg)
	conn, err := grpc.NewClient(strings.TrimPrefix(env.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rlsEnv{testEnv: env, client: ratelimitv3.NewRateLimitServiceClient(conn)}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlcommonv3.RateLimitDescriptor {
	d := &rlcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func rlsReq(ds ...*rlcommonv3.RateLimitDescriptor) *ratelimitv3.RateLimitRequest {
	return &ratelimitv3.RateLimitRequest{Domain: "quotaflow", Descriptors: ds}
}

func (e *rlsEnv) should(t *testing.T, req *ratelimitv3.RateLimitRequest) *ratelimitv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	return resp
}

func headerMap(hs []*corev3.HeaderValue) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	return m
}

const (
	rlsOK   = ratelimitv3.RateLimitResponse_OK
	rlsOver = ratelimitv3.RateLimitResponse_OVER_LIMIT
)

// inOneMinute returns at once when 5 s or more of the current minute are left, else at the
// next minute: rls-user's window is a minute, and a test whose calls a minute's end splits
// sees that rule's count start over (a CI run did, at 10:42:59).
func inOneMinute() {
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 5*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
}

// TestRLSOverGRPC drives one descriptor from OK to OVER_LIMIT with go-control-plane's gRPC
// client, as Envoy would.
func TestRLSOverGRPC(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	inOneMinute()
	user := id(t, "u")
	for i := 1; i <= 3; i++ {
		resp := e.should(t, rlsReq(desc("user_id", user, "path", "/rls/items?page=2", "authenticated", "true")))
		if resp.OverallCode != rlsOK || len(resp.Statuses) != 1 {
			t.Fatalf("call %d: %v, want OK with one status", i, resp)
		}
		st := resp.Statuses[0]
		cl := st.CurrentLimit
		if st.Code != rlsOK || st.LimitRemaining != uint32(3-i) || cl.GetName() != "rls-user" || cl.GetRequestsPerUnit() != 3 ||
			cl.GetUnit() != ratelimitv3.RateLimitResponse_RateLimit_MINUTE || cl.GetUnitMultiplier() != nil {
			t.Fatalf("call %d: status %v, want OK, %d remaining, rls-user 3 per MINUTE", i, st, 3-i)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("call %d: duration_until_reset %s, want within the minute", i, d)
		}
		h := headerMap(resp.ResponseHeadersToAdd)
		if h["X-RateLimit-Limit"] != "3" || h["X-RateLimit-Remaining"] != strconv.Itoa(3-i) || h["Retry-After"] != "" {
			t.Errorf("call %d: headers %v, want limit 3, remaining %d, no Retry-After", i, h, 3-i)
		}
		if r, err := strconv.Atoi(h["X-RateLimit-Reset"]); err != nil || r < 1 || r > 60 {
			t.Errorf("call %d: X-RateLimit-Reset %q, want seconds until reset (1..60)", i, h["X-RateLimit-Reset"])
		}
	}
	resp := e.should(t, rlsReq(desc("user_id", user, "path", "/rls/items")))
	st := resp.Statuses[0]
	if resp.OverallCode != rlsOver || st.Code != rlsOver || st.LimitRemaining != 0 {
		t.Fatalf("4th call: %v, want OVER_LIMIT with nothing remaining", resp)
	}
	h := headerMap(resp.ResponseHeadersToAdd)
	if ra, err := strconv.Atoi(h["Retry-After"]); err != nil || ra < 1 || ra > 60 || h["X-RateLimit-Remaining"] != "0" {
		t.Errorf("4th call: headers %v, want Retry-After within the minute and remaining 0", h)
	}
	// A user of another tier is checked under that tier's rules; a tier entry overrides it.
	resp = e.should(t, rlsReq(desc("user", "goldie", "endpoint", "/rls/x")))
	if cl := resp.Statuses[0].CurrentLimit; cl.GetName() != "rls-user-gold" {
		t.Errorf("gold user: limit %v, want rls-user-gold", cl)
	}
	resp = e.should(t, rlsReq(desc("user", id(t, "t"), "endpoint", "/rls/x", "tier", "gold")))
	if cl := resp.Statuses[0].CurrentLimit; cl.GetName() != "rls-user-gold" {
		t.Errorf("tier entry: limit %v, want rls-user-gold", cl)
	}
}

// TestRLSHitsAddend: the request's hits_addend is every descriptor's cost; a descriptor's own
// hits_addend replaces it; 0 means 1.
func TestRLSHitsAddend(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	inOneMinute()
	user := id(t, "u")
	req := rlsReq(desc("user_id", user, "path", "/rls/a"))
	req.HitsAddend = 2
	if st := e.should(t, req).Statuses[0]; st.Code != rlsOK || st.LimitRemaining != 1 {
		t.Fatalf("hits_addend 2: %v, want OK with 1 of 3 left", st)
	}
	req.HitsAddend = 0
	if st := e.should(t, req).Statuses[0]; st.Code != rlsOK || st.LimitRemaining != 0 {
		t.Fatalf("hits_addend 0: %v, want OK with 0 left", st)
	}
	user2 := id(t, "u2")
	d := desc("user_id", user2, "path", "/rls/a")
	d.HitsAddend = wrapperspb.UInt64(3)
	req = rlsReq(d, desc("api_key", id(t, "k")))
	req.HitsAddend = 1
	resp := e.should(t, req)
	if st := resp.Statuses[0]; st.Code != rlsOK || st.LimitRemaining != 0 {
		t.Errorf("descriptor hits_addend 3: %v, want OK with 0 left", st)
	}
	if st := resp.Statuses[1]; st.Code != rlsOK || st.LimitRemaining != 4 {
		t.Errorf("second descriptor (request hits_addend 1): %v, want 4 of 5 left", st)
	}
	d.HitsAddend = wrapperspb.UInt64(4) // more than the rule can ever allow
	_, err := e.client.ShouldRateLimit(context.Background(), rlsReq(d))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors[0].hits_addend: 4 is more than rule \"rls-user\"") {
		t.Errorf("hits_addend over the capacity: %v, want InvalidArgument naming descriptors[0].hits_addend", err)
	}
}

// TestRLSDescriptors: each descriptor is its own check; any over limit makes the response
// OVER_LIMIT, and the headers describe the most restrictive.
func TestRLSDescriptors(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newRLSEnv(t, checker.Config{Decisions: rec})
	inOneMinute()
	ip, user, key := id(t, "ip"), id(t, "u"), id(t, "k")
	req := rlsReq(desc("remote_address", ip), desc("user_id", user, "path", "/rls/x"), desc("api_key", key, "path", "/anything"))
	want := []struct {
		code   ratelimitv3.RateLimitResponse_Code
		left   [3]uint32
		header string // X-RateLimit-Remaining
	}{
		{rlsOK, [3]uint32{1, 2, 4}, "1"},
		{rlsOK, [3]uint32{0, 1, 3}, "0"},
		{rlsOver, [3]uint32{0, 0, 2}, "0"},
	}
	for i, w := range want {
		resp := e.should(t, req)
		if resp.OverallCode != w.code || len(resp.Statuses) != 3 {
			t.Fatalf("call %d: %v, want overall %s and 3 statuses", i+1, resp, w.code)
		}
		for j, st := range resp.Statuses {
			wantCode := rlsOK
			if i == 2 && j == 0 {
				wantCode = rlsOver
			}
			left := st.LimitRemaining
			if j == 2 && left > w.left[j] && left <= 4 {
				left = w.left[j] // the token bucket refills one a second: allow for a slow run
			}
			if st.Code != wantCode || left != w.left[j] {
				t.Errorf("call %d, descriptor %d: %v, want %s with %d left", i+1, j, st, wantCode, w.left[j])
			}
		}
		h := headerMap(resp.ResponseHeadersToAdd)
		if h["X-RateLimit-Remaining"] != w.header || h["X-RateLimit-Limit"] != "2" {
			t.Errorf("call %d: headers %v, want those of the IP descriptor (limit 2, remaining %s)", i+1, h, w.header)
		}
	}
	// The IP descriptor has no path: it is checked against "/" + domain (rule rls-ip).
	resp := e.should(t, rlsReq(desc("remote_address", ip)))
	st := resp.Statuses[0]
	if st.CurrentLimit.GetName() != "rls-ip" || st.CurrentLimit.GetUnit() != ratelimitv3.RateLimitResponse_RateLimit_HOUR {
		t.Errorf("ip descriptor: %v, want rls-ip per HOUR", st)
	}
	// The token bucket of 10 per 10s with a burst of 5: SECOND ×10, 5 remaining counted down.
	resp = e.should(t, rlsReq(desc("api_key", id(t, "k2"))))
	cl := resp.Statuses[0].CurrentLimit
	if cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != ratelimitv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 10 {
		t.Errorf("10 per 10s: current_limit %v, want 10 per SECOND ×10", cl)
	}
	if h := headerMap(resp.ResponseHeadersToAdd); h["X-RateLimit-Limit"] != "5" || h["X-RateLimit-Remaining"] != "4" {
		t.Errorf("token bucket headers %v, want limit 5 (the burst) and 4 remaining", h)
	}
	// Every descriptor was one published decision: 3 calls × 3 descriptors, then 2.
	rec.mu.Lock()
	n, endpoints := len(rec.decisions), map[string]int{}
	for _, d := range rec.decisions {
		endpoints[d.Endpoint]++
	}
	rec.mu.Unlock()
	if n != 11 || endpoints["/quotaflow"] != 5 || endpoints["/rls/x"] != 3 || endpoints["/anything"] != 3 {
		t.Errorf("published %d decisions by endpoint %v, want 11: 5 /quotaflow, 3 /rls/x, 3 /anything", n, endpoints)
	}
}

// TestRLSUnits: current_limit states the rule exactly in Envoy's units where it can.
func TestRLSUnits(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	for _, tt := range []struct {
		path string
		rpu  uint32
		unit ratelimitv3.RateLimitResponse_RateLimit_Unit
		mult uint32 // 0: none
	}{
		{"/rls/x", 3, ratelimitv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{"/2h", 7, ratelimitv3.RateLimitResponse_RateLimit_HOUR, 2},
		{"/7d", 70, ratelimitv3.RateLimitResponse_RateLimit_DAY, 7},
		{"/fast", 10, ratelimitv3.RateLimitResponse_RateLimit_SECOND, 0}, // 2 per 200ms
	} {
		st := e.should(t, rlsReq(desc("user_id", id(t, tt.path), "path", tt.path))).Statuses[0]
		cl := st.CurrentLimit
		if cl.GetRequestsPerUnit() != tt.rpu || cl.GetUnit() != tt.unit || cl.GetUnitMultiplier().GetValue() != tt.mult {
			t.Errorf("%s: current_limit %v, want %d per %s ×%d", tt.path, cl, tt.rpu, tt.unit, tt.mult)
		}
	}
}

// TestRLSShadowAndNoRule: shadow rules never make OVER_LIMIT nor show in the status; a check no
// rule applies to is OK with no limit.
func TestRLSShadowAndNoRule(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	user := id(t, "u")
	for i := 0; i < 3; i++ {
		resp := e.should(t, rlsReq(desc("user_id", user, "path", "/shadow")))
		if resp.OverallCode != rlsOK || resp.Statuses[0].Code != rlsOK || resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("shadow call %d: %v, want a bare OK", i+1, resp)
		}
	}
	resp := e.should(t, rlsReq(desc("user_id", user, "path", "/nothing/here")))
	if resp.OverallCode != rlsOK || resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("no rule: %v, want a bare OK", resp)
	}
}

// TestRLSDegraded: with Redis unreachable, each rule's fail mode decides, as for any check.
func TestRLSDegraded(t *testing.T) {
	t.Parallel()
	down := newRedis("127.0.0.1:1") // nothing listens there
	t.Cleanup(func() { down.Close() })
	e := newRLSEnv(t, checker.Config{Redis: down, RedisTimeout: 200 * time.Millisecond})
	resp := e.should(t, rlsReq(desc("user_id", "a", "path", "/open"), desc("user_id", "a", "path", "/closed")))
	if resp.OverallCode != rlsOver || resp.Statuses[0].Code != rlsOK || resp.Statuses[1].Code != rlsOver {
		t.Errorf("redis down: %v, want open OK, closed OVER_LIMIT", resp)
	}
}

// TestRLSInvalid: requests that cannot be checked are InvalidArgument naming the field, and
// charge nothing.
func TestRLSInvalid(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	user := id(t, "u")
	long := strings.Repeat("x", 257)
	negative := desc("user_id", user, "path", "/rls/x")
	negative.IsNegativeHits = true
	huge := desc("user_id", user)
	huge.HitsAddend = wrapperspb.UInt64(1 << 40)
	many := make([]*rlcommonv3.RateLimitDescriptor, MaxRLSDescriptors+1)
	for i := range many {
		many[i] = desc("user_id", user)
	}
	for _, tt := range []struct {
		name string
		req  *ratelimitv3.RateLimitRequest
		want string
	}{
		{"no descriptors", rlsReq(), "descriptors: required"},
		{"no entries", rlsReq(desc()), "descriptors[0].entries: required"},
		{"no subject", rlsReq(desc("user_id", user, "path", "/rls/x"), desc("path", "/rls/x")),
			"descriptors[1].entries: no subject (user_id, remote_address, api_key, or another key: a custom dimension)"},
		{"empty value", rlsReq(desc("remote_address", "")), "descriptors[0].entries[0].value: required"},
		{"long subject", rlsReq(desc("user_id", user, "api_key", long)), "descriptors[0].entries[1].value: must be at most 256 bytes, got 257"},
		{"long custom dimension", rlsReq(desc("user_id", user, "tenant", long)), "descriptors[0].entries[1].value: must be at most 256 bytes, got 257"},
		{"too many custom dimensions", rlsReq(desc("k0", "v", "k1", "v", "k2", "v", "k3", "v", "k4", "v", "k5", "v", "k6", "v", "k7", "v",
			"k8", "v", "k9", "v", "k10", "v", "k11", "v", "k12", "v", "k13", "v", "k14", "v", "k15", "v", "k16", "v")),
			"descriptors[0].entries: at most 16 entries of custom dimensions"},
		{"two users", rlsReq(desc("user_id", user, "user", "other")), "descriptors[0].entries[1].key: a second user subject"},
		{"two paths", rlsReq(desc("user_id", user, "path", "/a", "endpoint", "/b")), "descriptors[0].entries[2].key: a second endpoint"},
		{"unknown tier", rlsReq(desc("user_id", user, "path", "/rls/x"), desc("user_id", user, "tier", "platinum")),
			`descriptors[1].entries[1].value: "platinum" is not a configured tier`},
		{"negative hits", rlsReq(negative), "descriptors[0].is_negative_hits: not supported"},
		{"huge hits", rlsReq(huge), "descriptors[0].hits_addend: must be at most 1000000"},
		{"too many", rlsReq(many...), "descriptors: at most 64 descriptors, got 65"},
	} {
		_, err := e.client.ShouldRateLimit(context.Background(), tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("%s: %v, want InvalidArgument %q", tt.name, err, tt.want)
		}
	}
	req := rlsReq(desc("user_id", user, "path", "/rls/x"))
	req.Domain = long + long + long + long + long // over checker.MaxEndpointLen with the slash
	if _, err := e.client.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "domain: must be at most") {
		t.Errorf("long domain: %v, want InvalidArgument naming domain", err)
	}
	// Invalid UTF-8 cannot cross the wire in a proto3 string; the handler checks it anyway.
	_, err := e.srv.ShouldRateLimit(context.Background(), connect.NewRequest(rlsReq(desc("user_id", "bad\xff"))))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "descriptors[0].entries[0].value: must be valid UTF-8") {
		t.Errorf("invalid UTF-8: %v, want InvalidArgument naming descriptors[0].entries[0].value", err)
	}
	// None of the refused requests charged the user.
	if st := e.should(t, rlsReq(desc("user_id", user, "path", "/rls/x"))).Statuses[0]; st.LimitRemaining != 2 {
		t.Errorf("after refused requests: %v, want the first charge (2 of 3 left)", st)
	}
	// Another method of the service does not exist.
	conn, _ := grpc.NewClient(strings.TrimPrefix(e.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	err = conn.Invoke(context.Background(), "/"+RLSServiceName+"/Nope", rlsReq(), &ratelimitv3.RateLimitResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want Unimplemented", err)
	}
}

// TestRLSConnectJSON: the handler also speaks Connect with JSON, e.g. for curl.
func TestRLSConnectJSON(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	body := `{"domain":"quotaflow","descriptors":[{"entries":[{"key":"user_id","value":"` + id(t, "u") + `"},{"key":"path","value":"/rls/j"}]}]}`
	resp, err := http.Post(e.url+RLSProcedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got ratelimitv3.RateLimitResponse
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	if err := protojson.Unmarshal(buf.Bytes(), &got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST: %s %s (%v)", resp.Status, buf.String(), err)
	}
	if got.OverallCode != rlsOK || got.Statuses[0].LimitRemaining != 2 {
		t.Errorf("response %s, want OK with 2 left", buf.String())
	}
}

// grpcurlPath finds grpcurl on PATH or in GOPATH/bin, where `go install` puts it.
func grpcurlPath() string {
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		gopath = build.Default.GOPATH
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "grpcurl")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// TestRLSGrpcurl calls the service with grpcurl, which learns its schema from the server's
// reflection: Handler's reflector must name RLSServiceName.
func TestRLSGrpcurl(t *testing.T) {
	t.Parallel()
	bin := grpcurlPath()
	if bin == "" {
		t.Skip("grpcurl not found on PATH or in GOPATH/bin (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@latest)")
	}
	e := newRLSEnv(t, checker.Config{})
	addr := strings.TrimPrefix(e.url, "http://")
	grpcurl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, append([]string{"-plaintext"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := grpcurl(addr, "list"); !strings.Contains(out, RLSServiceName) {
		t.Fatalf("grpcurl list = %q: reflection does not name %s (add it to the reflector in Handler)", out, RLSServiceName)
	}
	user := id(t, "u")
	body := `{"domain":"quotaflow","hits_addend":2,"descriptors":[{"entries":[{"key":"user_id","value":"` + user + `"},{"key":"path","value":"/rls/g"}]}]}`
	out := grpcurl("-d", body, addr, RLSServiceName+"/ShouldRateLimit")
	var got ratelimitv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("grpcurl output %q: %v", out, err)
	}
	if got.OverallCode != rlsOK || len(got.Statuses) != 1 || got.Statuses[0].LimitRemaining != 1 || got.Statuses[0].CurrentLimit.GetName() != "rls-user" {
		t.Errorf("grpcurl ShouldRateLimit = %s, want OK with 1 of rls-user's 3 left", out)
	}
}

// TestRLSEnvoyConfig checks deploy/envoy/envoy.yaml against go-control-plane's types (field
// names, enums, typed configs) and against the mapping: domain, descriptor keys, an HTTP/2
// cluster for the rate limit service.
func TestRLSEnvoyConfig(t *testing.T) {
	t.Parallel()
	bs := envoyBootstrap(t)
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.Name] = c
	}
	lis := bs.GetStaticResources().GetListeners()
	if len(lis) != 1 || lis[0].GetAddress().GetSocketAddress().GetPortValue() != 10000 {
		t.Fatalf("listeners %v, want one on :10000", lis)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := lis[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("http_connection_manager: %v", err)
	}
	var rl ratelimitfilterv3.RateLimit
	filters := hcm.GetHttpFilters()
	// The filters before ratelimit guard the check: TestEnvoyConfigGuardsTheCheck.
	at := slices.IndexFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == "envoy.filters.http.ratelimit" })
	if at < 0 || filters[len(filters)-1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v, want ratelimit, and router last", filters)
	}
	if err := filters[at].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	if err := rl.ValidateAll(); err != nil {
		t.Fatalf("ratelimit filter: %v", err)
	}
	svc := rl.GetRateLimitService()
	rlsCluster := clusters[svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if rl.GetDomain() != "quotaflow" || svc.GetTransportApiVersion() != corev3.ApiVersion_V3 || rlsCluster == nil {
		t.Fatalf("ratelimit filter %v, want domain quotaflow, the V3 API and a cluster that exists", &rl)
	}
	var opts upstreamhttpv3.HttpProtocolOptions
	if err := rlsCluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil ||
		opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Fatalf("cluster %s must speak HTTP/2 (gRPC): %v", rlsCluster.Name, err)
	}
	if port := rlsCluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8080 {
		t.Errorf("quotaflow cluster port %d, want the checker's 8080", port)
	}
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute()
	if clusters[route.GetCluster()] == nil {
		t.Errorf("route to %q: no such cluster", route.GetCluster())
	}
	var keys [][]string
	for _, limit := range route.GetRateLimits() {
		var ks []string
		for _, a := range limit.GetActions() {
			switch a := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				ks = append(ks, "remote_address")
			case *routev3.RateLimit_Action_RequestHeaders_:
				ks = append(ks, a.RequestHeaders.GetDescriptorKey())
			default:
				t.Errorf("unexpected action %v", a)
			}
		}
		keys = append(keys, ks)
		var kv []string
		for _, k := range ks {
			kv = append(kv, k, "/value")
		}
		if _, err := rlsQueries(rlsReq(desc(kv...))); err != nil {
			t.Errorf("descriptor %v is not a quotaflow check: %v", ks, err)
		}
	}
	if len(keys) != 2 || strings.Join(keys[0], ",") != "remote_address" || strings.Join(keys[1], ",") != "user_id,path" {
		t.Errorf("descriptors %v, want [remote_address] [user_id path]", keys)
	}
	// Envoy refuses deprecated fields by default.
	for _, m := range []proto.Message{bs, &hcm, &rl, &opts} {
		if d := deprecatedFields(m.ProtoReflect(), nil); len(d) > 0 {
			t.Errorf("%s sets deprecated fields %v", m.ProtoReflect().Descriptor().FullName(), d)
		}
	}
}

// deprecatedFields lists the fields set in m, at any depth, that are marked deprecated.
func deprecatedFields(m protoreflect.Message, found []string) []string {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if opts, ok := fd.Options().(*descriptorpb.FieldOptions); ok && opts.GetDeprecated() {
			found = append(found, string(fd.FullName()))
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				found = deprecatedFields(v.List().Get(i).Message(), found)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				found = deprecatedFields(mv.Message(), found)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			found = deprecatedFields(v.Message(), found)
		}
		return true
	})
	return found
}

// TestRLSGlobalOncePerRequest: an Envoy request with several descriptors is one incoming
// request, so global rules count it once.
func TestRLSGlobalOncePerRequest(t *testing.T) {
	t.Parallel()
	doc := `rules:
- {id: g, dimension: global, endpoint: /g/*, algorithm: fixed_window, limit: 3, window: 1h}
- {id: u, dimension: user, endpoint: /g/*, algorithm: fixed_window, limit: 100, window: 1h}
- {id: i, dimension: ip, endpoint: /g/*, algorithm: fixed_window, limit: 100, window: 1h}
`
	e := newRLSEnv(t, checker.Config{Rules: mustRules(t, doc)})
	resetGlobal(t, e.testEnv, "g") // the one bucket every run of the test shares
	req := rlsReq(desc("remote_address", testIP(t, "client"), "path", "/g/x"), desc("user_id", id(t, "u"), "path", "/g/x"))
	for i := 0; i < 3; i++ {
		if got := e.should(t, req); got.OverallCode != rlsOK {
			t.Fatalf("request %d with two descriptors: %s, want OK (global limit 3 counts requests, not descriptors)", i+1, got.OverallCode)
		}
	}
	if got := e.should(t, req); got.OverallCode != rlsOver || got.Statuses[0].Code != rlsOver {
		t.Errorf("4th request: %s (first descriptor %s), want OVER_LIMIT from the global rule", got.OverallCode, got.Statuses[0].Code)
	}
}
