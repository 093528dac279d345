package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// The fuzz targets send whatever bytes the fuzzer makes to the real handler of every entry
// point, on an engine over the package's real Redis, and check the three properties no input
// may break: no panic (which fails the target by itself: the handler runs in the test's
// goroutine), no server error (HTTP 500, Connect internal or unknown), and no Redis key outside
// the rl: namespace.

// fuzzConnectCodes are the Connect codes an entry point may answer: anything else is a bug
// (internal, unknown) or a code no caller can act on.
var fuzzConnectCodes = []string{"invalid_argument", "permission_denied", "unavailable", "resource_exhausted",
	"unauthenticated", "failed_precondition"}

// fuzzHTTPStatuses are the statuses forward-auth may answer. 401 is an unauthenticated caller,
// as on the Connect side.
var fuzzHTTPStatuses = []int{http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
	http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable}

// keyGuard is a hook on the engine's Redis client in the fuzz targets: it notes every key a
// script call (EVALSHA, EVAL) or a DEL names that is not a bucket key (outside rl:, or holding
// a line break that a log or a RESP inline command would split). It sees what reaches Redis,
// whatever the engine's path to it. The engine is shared by all the inputs of a fuzz worker,
// which run one after the other, so each input takes the keys noted since the last; a command
// sent after its check gave up (past RedisTimeout) is noted for the next input.
type keyGuard struct {
	mu  sync.Mutex
	bad []string
}

var _ redis.Hook = (*keyGuard)(nil)

// watch adds g to rdb, and on a cluster to each node's client, through which the bucket
// store sends its pipelines.
func (g *keyGuard) watch(rdb redis.UniversalClient) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(c *redis.Client) { c.AddHook(g) })
	}
	rdb.AddHook(g)
}

// DialHook implements redis.Hook.
func (g *keyGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (g *keyGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.note(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (g *keyGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			g.note(cmd)
		}
		return next(ctx, cmds)
	}
}

// note records the keys of cmd that are not bucket keys.
func (g *keyGuard) note(cmd redis.Cmder) {
	args := cmd.Args()
	var keys []any
	switch strings.ToLower(argString(args[0])) {
	case "evalsha", "eval", "fcall": // EVALSHA sha (FCALL function) numkeys key... arg...
		if len(args) < 3 {
			return
		}
		n, err := strconv.Atoi(argString(args[2]))
		if err != nil || 3+n > len(args) {
			g.add(fmt.Sprintf("unreadable key count in %v", args))
			return
		}
		keys = args[3 : 3+n]
	case "del", "unlink":
		keys = args[1:]
	}
	for _, k := range keys {
		if k := argString(k); !strings.HasPrefix(k, "rl:") || strings.ContainsAny(k, "\r\n") {
			g.add(k)
		}
	}
}

func (g *keyGuard) add(k string) {
	g.mu.Lock()
	g.bad = append(g.bad, k)
	g.mu.Unlock()
}

// argString is a command argument as Redis receives it (the bucket store passes pointers, so
// that an argument is boxed once).
func argString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case *string:
		return *v
	case []byte:
		return string(v)
	case *int64:
		return strconv.FormatInt(*v, 10)
	}
	return fmt.Sprint(a)
}

// checkKeys fails t for each key outside the namespace since the last call.
func (g *keyGuard) checkKeys(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	bad := g.bad
	g.bad = nil
	g.mu.Unlock()
	for _, k := range bad {
		t.Errorf("the engine touched key %q: outside the rl: namespace, or holding a line break", k)
	}
}

// fuzzEnv is one engine served by two Servers: open is the zero Config (anyone may check,
// nobody may assert a tier or reset, no proxy is trusted); gateway trusts the caller as a
// gateway in front of the checker is trusted (anonymous callers may assert tiers and reset,
// httptest's 192.0.2.1 is a trusted proxy, X-Idempotency-Key is read), so that inputs reach
// the tier, reset, forwarded address and idempotency paths too.
type fuzzEnv struct {
	keys          *keyGuard
	open, gateway http.Handler
}

// newFuzzEnv builds the environment once per fuzz target (and per fuzz worker process, each of
// which runs TestMain with its own redis-server), outside f.Fuzz.
func newFuzzEnv(f *testing.F, doc string) *fuzzEnv {
	f.Helper()
	rdb := redisSrv.UniversalClient()
	f.Cleanup(func() { rdb.Close() })
	keys := new(keyGuard)
	keys.watch(rdb)
	log := checkertest.Logger()
	// A short timeout: an input that stalls the store must not stall the run; past it the
	// fail modes decide, which is one more path to cover.
	engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(f, doc), RedisTimeout: 200 * time.Millisecond, Logger: log})
	f.Cleanup(func() { engine.Close() })

	callers := new(auth.Registry)
	if err := callers.Load([]byte("anonymous: {permissions: [check, assert-tier, reset]}\n")); err != nil {
		f.Fatal(err)
	}
	gateway := New(engine, Config{Logger: log, Callers: callers, ForwardAuth: ForwardAuthConfig{
		TrustedProxies:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		IdempotencyHeader: "X-Idempotency-Key",
	}})
	return &fuzzEnv{keys: keys, open: New(engine, Config{Logger: log}).Handler(), gateway: gateway.Handler()}
}

// serve runs r on the open Server, or on the gateway one when sel's low bit is set, and checks
// the keys the call touched.
func (e *fuzzEnv) serve(t *testing.T, sel byte, r *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	h := e.open
	if sel&1 != 0 {
		h = e.gateway
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	e.keys.checkKeys(t)
	return w
}

// post sends body as contentType to procedure.
func (e *fuzzEnv) post(t *testing.T, sel byte, procedure, contentType string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, procedure, bytes.NewReader(body))
	r.Header.Set("Content-Type", contentType)
	return e.serve(t, sel, r)
}

// checkConnect fails t when a Connect answer is a server error: HTTP 500, or an error whose
// code is not one a client can act on.
func checkConnect(t *testing.T, w *httptest.ResponseRecorder, input []byte) {
	t.Helper()
	if w.Code == http.StatusOK {
		return
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("input %q: HTTP %d with a body that is no Connect error (%v): %q", input, w.Code, err, w.Body.Bytes())
	}
	if w.Code == http.StatusInternalServerError || !slices.Contains(fuzzConnectCodes, e.Code) {
		t.Fatalf("input %q: HTTP %d, code %q (%s); want one of %v", input, w.Code, e.Code, e.Message, fuzzConnectCodes)
	}
}

// rateLimiterProcedures are the RateLimiter methods, chosen by the selector byte's bits above
// the lowest.
var rateLimiterProcedures = [...]string{
	quotaflowv1connect.RateLimiterCheckRateLimitProcedure,
	quotaflowv1connect.RateLimiterGetRemainingQuotaProcedure,
	quotaflowv1connect.RateLimiterResetLimitProcedure,
}

func rateLimiterProcedure(sel byte) string {
	return rateLimiterProcedures[int(sel>>1)%len(rateLimiterProcedures)]
}

// rateLimiterSel is the selector byte of seed i: the procedure of m's type, and the Server by
// turns.
func rateLimiterSel(i int, m proto.Message) byte {
	sel := byte(i & 1)
	switch m.(type) {
	case *quotaflowv1.GetRemainingQuotaRequest:
		sel |= 1 << 1
	case *quotaflowv1.ResetLimitRequest:
		sel |= 2 << 1
	}
	return sel
}

// rateLimiterSeeds are requests of each method: valid ones of each rule shape of testRules,
// and the edge cases of TestInvalidRequests and TestResetLimit.
func rateLimiterSeeds() []proto.Message {
	user, ip, key := quotaflowv1.Dimension_DIMENSION_USER, quotaflowv1.Dimension_DIMENSION_IP, quotaflowv1.Dimension_DIMENSION_API_KEY
	now := time.Now().UnixMilli()
	return []proto.Message{
		&quotaflowv1.CheckRateLimitRequest{Identifier: "u1", Dimension: user, Endpoint: "/orders"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "vip", Dimension: user, Endpoint: "/orders", Cost: 3, Timestamp: now},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "u1", Dimension: user, Endpoint: "/api/items", IdempotencyKey: "k-1",
			Subjects: []*quotaflowv1.Subject{{Dimension: ip, Identifier: "192.0.2.7"}, {Dimension: key, Identifier: "key-1"}}},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "u1", Dimension: user, Endpoint: "/global/x", Tier: "premium"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "u1", Dimension: user, Endpoint: "/fm/local"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a}:tb:1h:/x", Dimension: user, Endpoint: "/shadow", IdempotencyKey: "}\r\n:rl"},
		&quotaflowv1.CheckRateLimitRequest{Endpoint: "/x"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: quotaflowv1.Dimension_DIMENSION_GLOBAL, Endpoint: "/x"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: 42, Endpoint: "/x"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: strings.Repeat("a", 257), Dimension: user, Endpoint: "/x"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Cost: -1},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Cost: 1_000_001},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/api/x", Cost: 5},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Timestamp: 1},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Timestamp: 1 << 62},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Tier: "gold"},
		&quotaflowv1.CheckRateLimitRequest{Identifier: "a", Dimension: user, Endpoint: "/x", Subjects: []*quotaflowv1.Subject{{Dimension: user, Identifier: "b"}}},
		&quotaflowv1.GetRemainingQuotaRequest{Identifier: "u1", Dimension: user, Endpoint: "/multi", Cost: 2},
		&quotaflowv1.GetRemainingQuotaRequest{Identifier: "custom", Dimension: user, Endpoint: "/orders", Tier: "free",
			Subjects: []*quotaflowv1.Subject{{Dimension: ip, Identifier: "::1"}}},
		&quotaflowv1.ResetLimitRequest{Identifier: "u1", Dimension: user},
		&quotaflowv1.ResetLimitRequest{Identifier: "u1", Dimension: user, Endpoint: "/orders", RuleId: "user-orders"},
		&quotaflowv1.ResetLimitRequest{Dimension: quotaflowv1.Dimension_DIMENSION_GLOBAL, Endpoint: "/global/x"},
		&quotaflowv1.ResetLimitRequest{Identifier: "a}:tb:1h:/x", Dimension: ip, RuleId: "user-orders"},
		&quotaflowv1.ResetLimitRequest{Identifier: "u1", Dimension: key, RuleId: "nope"},
	}
}

func FuzzConnectJSON(f *testing.F) {
	for i, m := range rateLimiterSeeds() {
		b, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(rateLimiterSel(i, m), b)
	}
	// TestInvalidJSON's bodies, and JSON that no message marshals to.
	for i, s := range []string{
		`{"identifier":"a","dimension":"DIMENSION_USER","endpoint":"/x","cost":-5}`,
		"{\"identifier\":\"a\xffb\",\"dimension\":\"DIMENSION_USER\",\"endpoint\":\"/x\"}",
		`{"identifier":"a","dimension":"DIMENSION_USER","endpoint":"/x","cost":"many"}`,
		`{"identifier":"a","dimension":1,"endpoint":"/x","cost":"9223372036854775807","timestamp":"-9223372036854775808"}`,
		`{"identifier":"a","dimension":"DIMENSION_USER","endpoint":"/x","unknown":[{}]}`,
		`{"subjects":[null]}`, `[]`, `null`, ``,
	} {
		f.Add(byte(i), []byte(s))
	}
	env := newFuzzEnv(f, testRules)
	f.Fuzz(func(t *testing.T, sel byte, body []byte) {
		checkConnect(t, env.post(t, sel, rateLimiterProcedure(sel), "application/json", body), body)
	})
}

func FuzzConnectProto(f *testing.F) {
	for i, m := range rateLimiterSeeds() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(rateLimiterSel(i, m), b)
	}
	// Invalid UTF-8 in a string field, which proto.Marshal refuses to write.
	b, _ := proto.Marshal(&quotaflowv1.CheckRateLimitRequest{Identifier: "badX", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/x"})
	f.Add(byte(0), bytes.Replace(b, []byte("badX"), []byte("bad\xff"), 1))
	f.Add(byte(0), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}) // a length past the end
	f.Add(byte(2), []byte{})
	env := newFuzzEnv(f, testRules)
	f.Fuzz(func(t *testing.T, sel byte, body []byte) {
		checkConnect(t, env.post(t, sel, rateLimiterProcedure(sel), "application/proto", body), body)
	})
}

// rlsSeeds are TestRLS*'s requests: valid ones of each descriptor shape and the invalid ones
// of TestRLSInvalid.
func rlsSeeds() []*ratelimitv3.RateLimitRequest {
	own := desc("user_id", "u2", "path", "/rls/a")
	own.HitsAddend = wrapperspb.UInt64(3)
	addend := rlsReq(own, desc("api_key", "k"))
	addend.HitsAddend = 2
	negative := desc("user_id", "u", "path", "/rls/x")
	negative.IsNegativeHits = true
	huge := desc("user_id", "u")
	huge.HitsAddend = wrapperspb.UInt64(1 << 40)
	many := make([]*rlcommonv3.RateLimitDescriptor, MaxRLSDescriptors+1)
	for i := range many {
		many[i] = desc("user_id", "u")
	}
	return []*ratelimitv3.RateLimitRequest{
		rlsReq(desc("user_id", "u", "path", "/rls/items?page=2", "authenticated", "true")),
		rlsReq(desc("user", "goldie", "endpoint", "/rls/x")),
		rlsReq(desc("user", "t", "endpoint", "/rls/x", "tier", "gold")),
		addend,
		rlsReq(desc("remote_address", "192.0.2.9"), desc("user_id", "u", "path", "/rls/x"), desc("api_key", "k", "path", "/anything")),
		rlsReq(desc("user_id", "u", "path", "/shadow"), desc("user_id", "u", "path", "/fast"), desc("user_id", "u", "path", "/7d")),
		{Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("ip", "::1")}},
		rlsReq(),
		rlsReq(desc()),
		rlsReq(desc("path", "/rls/x", "generic_key", "g")),
		rlsReq(desc("remote_address", "")),
		rlsReq(desc("user_id", "u", "api_key", strings.Repeat("x", 257))),
		rlsReq(desc("user_id", "u", "user", "other")),
		rlsReq(desc("user_id", "u", "path", "/a", "endpoint", "/b")),
		rlsReq(desc("user_id", "u", "tier", "platinum")),
		rlsReq(negative),
		rlsReq(huge),
		rlsReq(many...),
		{Domain: "a}:{b\n", Descriptors: []*rlcommonv3.RateLimitDescriptor{desc("user_id", "{user:1}", "path", "?")}},
	}
}

func FuzzRLS(f *testing.F) {
	for i, req := range rlsSeeds() {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(i)&^2, b)
		if b, err = protojson.Marshal(req); err != nil {
			f.Fatal(err)
		}
		f.Add(byte(i)|2, b)
	}
	env := newFuzzEnv(f, rlsRules)
	f.Fuzz(func(t *testing.T, sel byte, body []byte) {
		// The second bit picks the codec, so that one input mutates across both.
		contentType := "application/proto"
		if sel&2 != 0 {
			contentType = "application/json"
		}
		checkConnect(t, env.post(t, sel, RLSProcedure, contentType, body), body)
	})
}

func FuzzForwardAuth(f *testing.F) {
	// The cases of TestForwardAuth and TestForwardAuthInputs, and forwarded addresses to walk.
	type seed struct {
		sel                                           byte
		user, key, uri, cost, xff, realIP, tier, idem string
		query                                         string
	}
	for _, s := range []seed{
		{1, "u1", "", "/api/v1/items?page=2", "", "", "192.0.2.44", "", "", ""},
		{1, "", "", "", "", "198.51.100.1, 10.0.0.1", "", "", "", ""},
		{0, "", "key-1", "", "", "", "", "", "", "endpoint=/api/b&cost=2"},
		{0, "", "", "/api/a", "", "", "", "", "", ""},
		{0, "u", "", "", "", "", "", "", "", ""},
		{0, "u", "", "", "lots", "", "", "", "", "endpoint=/a"},
		{0, "u", "", "", "", "", "", "", "", "endpoint=/a&cost=-3"},
		{0, "\xff", "", "", "", "", "", "", "", "endpoint=/a"},
		{1, "u", "", "", "", "", "", "", "", "endpoint=/a&tier=gold"},
		{0, "u", "", "/orders", "", "", "", "premium", "", ""},
		{1, "u", "", "/orders", "9223372036854775807", "", "", "premium", "idem-1", ""},
		{1, "a}:tb:1h:/x", "k\t", "/fm/closed", "1", "2001:db8::1, ::ffff:192.0.2.3, 192.0.2.200", "", "", "}\x7f", "tier=free&endpoint=%00"},
		{1, "u", "", "/global/x", "", "garbage, 192.0.2.1", "not-an-ip", "", strings.Repeat("k", 257), "endpoint=/x&endpoint=/y"},
	} {
		f.Add(s.sel, s.user, s.key, s.uri, s.cost, s.xff, s.realIP, s.tier, s.idem, s.query)
	}
	env := newFuzzEnv(f, testRules)
	f.Fuzz(func(t *testing.T, sel byte, user, key, uri, cost, xff, realIP, tier, idem, query string) {
		r := httptest.NewRequest(http.MethodGet, "/ratelimit/check", nil)
		// Set after NewRequest, which panics on a target it cannot parse: a raw query reaches
		// the handler as the client sent it.
		r.URL.RawQuery = query
		for name, v := range map[string]string{"X-User-Id": user, "X-Api-Key": key, "X-Forwarded-Uri": uri,
			"X-RateLimit-Cost": cost, "X-Forwarded-For": xff, "X-Real-Ip": realIP, "X-RateLimit-Tier": tier,
			"X-Idempotency-Key": idem} {
			if !validHeaderValue(v) {
				return // net/http and every proxy refuse the request before a handler sees it
			}
			if v != "" {
				r.Header.Set(name, v)
			}
		}
		w := env.serve(t, sel, r)
		if !slices.Contains(fuzzHTTPStatuses, w.Code) {
			t.Fatalf("GET /ratelimit/check?%q with %q: HTTP %d %q; want one of %v", query, r.Header, w.Code, w.Body.Bytes(), fuzzHTTPStatuses)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("GET /ratelimit/check?%q with %q: HTTP %d with a body that is not JSON: %q", query, r.Header, w.Code, w.Body.Bytes())
		}
	})
}

// validHeaderValue reports whether v can travel as a header value: no control bytes but tab
// (RFC 9110's field-value, as net/http's server checks it).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
