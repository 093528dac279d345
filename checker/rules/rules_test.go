package rules

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

const sample = `
default_tier: free
tiers:
  free: {description: everyone}
  premium: {}
users:
  "42": {tier: premium, limits: {user-orders: 500}}
  "7": {tier: free}
rules:
  - {id: user-all, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 1000, window: 1h}
  - {id: user-api, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 100, window: 1m, burst: 20}
  - {id: user-api-premium, dimension: user, endpoint: /api/*, tier: premium, algorithm: token_bucket, limit: 1000, window: 1m}
  - {id: user-api-premium-s, dimension: user, endpoint: /api/*, tier: premium, algorithm: gcra, limit: 50, window: 1s}
  - {id: user-v1, dimension: user, endpoint: /api/v1/*, algorithm: sliding_window_counter, limit: 60, window: 1m}
  - {id: user-orders, dimension: user, endpoint: /api/v1/orders, algorithm: sliding_window_log, limit: 10, window: 1m, shadow: true}
  - {id: ip-all, dimension: ip, endpoint: /*, algorithm: leaky_bucket, limit: 300, window: 1m, fail_mode: local}
  - {id: global-api, dimension: global, endpoint: /api/*, algorithm: gcra, limit: 100000, window: 1s, fail_mode: closed}
  - {id: global-hot, dimension: global, endpoint: /hot, algorithm: fixed_window, limit: 1000000, window: 1s, lease: {slice: 250}}
`

func mustParse(t testing.TB, doc string) *Set {
	t.Helper()
	s, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func ids(rs []*Rule) string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return strings.Join(out, ",")
}

func TestMatch(t *testing.T) {
	t.Parallel()
	s := mustParse(t, sample)
	tests := []struct {
		dim      Dimension
		tier     string
		endpoint string
		want     string
	}{
		{DimensionUser, "free", "/api/v1/orders", "user-orders"},
		{DimensionUser, "free", "/api/v1/orders/9", "user-v1"},
		{DimensionUser, "free", "/api/v1", "user-v1"},
		{DimensionUser, "free", "/api/v2/items", "user-api"},
		{DimensionUser, "free", "/api", "user-api"},
		{DimensionUser, "free", "/apix", "user-all"},
		{DimensionUser, "free", "/", "user-all"},
		{DimensionUser, "premium", "/api/v2/items", "user-api-premium,user-api-premium-s"},
		{DimensionUser, "premium", "/api/v1/x", "user-v1"},
		{DimensionUser, "premium", "/health", "user-all"},
		{DimensionIP, "free", "/anything/at/all", "ip-all"},
		{DimensionIP, "premium", "/", "ip-all"},
		{DimensionAPIKey, "free", "/api/v1/orders", ""},
		{DimensionGlobal, "free", "/api/x", "global-api"},
		{DimensionGlobal, "free", "/web", ""},
		{DimensionUser, "unknown-tier", "/api", ""},
	}
	for _, tt := range tests {
		t.Run(tt.dim.String()+"/"+tt.tier+tt.endpoint, func(t *testing.T) {
			if got := ids(s.Match(tt.dim, tt.tier, tt.endpoint)); got != tt.want {
				t.Errorf("Match(%s, %s, %s) = %q, want %q", tt.dim, tt.tier, tt.endpoint, got, tt.want)
			}
		})
	}
}

func TestParseValues(t *testing.T) {
	t.Parallel()
	s := mustParse(t, sample)
	r, ok := s.Rule("user-api")
	if !ok {
		t.Fatal("rule user-api missing")
	}
	want := Rule{ID: "user-api", Dimension: DimensionUser, Endpoint: "/api/*", Algorithm: algorithm.TokenBucket,
		Limit: 100, Window: time.Minute, Burst: 20, FailMode: FailOpen}
	if !reflect.DeepEqual(*r, want) {
		t.Errorf("user-api = %+v, want %+v", *r, want)
	}
	if r, _ := s.Rule("user-all"); r.Burst != 1000 {
		t.Errorf("user-all burst = %d, want the limit 1000", r.Burst)
	}
	if r, _ := s.Rule("user-orders"); !r.Shadow {
		t.Error("user-orders: shadow = false, want true")
	}
	if r, _ := s.Rule("global-hot"); r.Allotment != 250 {
		t.Errorf("global-hot lease slice = %d, want 250", r.Allotment)
	}
	if r, _ := s.Rule("global-api"); r.Allotment != 0 {
		t.Errorf("global-api lease slice = %d, want 0 (not leased)", r.Allotment)
	}
	if r, _ := s.Rule("ip-all"); r.FailMode != FailLocal {
		t.Errorf("ip-all fail mode = %s, want local", r.FailMode)
	}
	if got := s.TierOf("42"); got != "premium" {
		t.Errorf("TierOf(42) = %q, want premium", got)
	}
	if got := s.TierOf("nobody"); got != "free" {
		t.Errorf("TierOf(nobody) = %q, want the default free", got)
	}
	if u, _ := s.User("42"); u.Limits["user-orders"] != 500 {
		t.Errorf("user 42 custom limit = %d, want 500", u.Limits["user-orders"])
	}
	if !s.HasTier("premium") || s.HasTier("gold") {
		t.Error("HasTier: want premium declared and gold not")
	}
}

func TestImplicitTier(t *testing.T) {
	t.Parallel()
	s := mustParse(t, "rules:\n- {id: a, dimension: ip, endpoint: '*', algorithm: gcra, limit: 5, window: 1s}\n")
	if s.DefaultTier() != ImplicitTier {
		t.Errorf("DefaultTier = %q, want %q", s.DefaultTier(), ImplicitTier)
	}
	if got := ids(s.Match(DimensionIP, ImplicitTier, "/x")); got != "a" {
		t.Errorf("Match = %q, want a", got)
	}
}

// TestCustomLimit: a user's custom limit replaces the rule's, and the burst follows it only
// when the file left it to default (or the algorithm has none of its own).
func TestCustomLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		rule                 Rule
		custom               int64
		wantLimit, wantBurst int64
	}{
		{"no custom limit", Rule{Dimension: DimensionUser, Algorithm: algorithm.TokenBucket, Limit: 10, Burst: 10, Window: time.Second}, 0, 10, 10},
		{"default burst follows the limit", Rule{Dimension: DimensionUser, Algorithm: algorithm.GCRA, Limit: 10, Burst: 10, Window: time.Second}, 50, 50, 50},
		{"explicit burst is kept", Rule{Dimension: DimensionAPIKey, Algorithm: algorithm.TokenBucket, Limit: 10, Burst: 3, Window: time.Second}, 50, 50, 3},
		{"window algorithm", Rule{Dimension: DimensionUser, Algorithm: algorithm.FixedWindow, Limit: 10, Burst: 10, Window: time.Second}, 7, 7, 7},
	}
	var s Set
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if limit, burst := s.Effective(&tt.rule, tt.rule.Dimension, "u", "", tt.custom, time.Now()); limit != tt.wantLimit || burst != tt.wantBurst {
				t.Errorf("Effective = limit %d burst %d, want %d and %d", limit, burst, tt.wantLimit, tt.wantBurst)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	const ok = "{id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}"
	tests := []struct {
		name, doc string
		want      []string // each must appear in the error
	}{
		{"empty", "", []string{"empty"}},
		{"no rules", "rules: []", []string{"rules: at least one rule"}},
		{"unknown field", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, limt: 3}", []string{"limt"}},
		{"missing id", "rules:\n- {dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}", []string{"rules[0]: id: required"}},
		{"bad dimension", "rules:\n- {id: a, dimension: users, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}", []string{`rule "a" (rules[0]): dimension: unknown dimension "users"`}},
		{"bad endpoint", "rules:\n- {id: a, dimension: user, endpoint: api, algorithm: gcra, limit: 5, window: 1s}", []string{`rule "a" (rules[0]): endpoint:`, `must start with "/"`}},
		{"star inside", "rules:\n- {id: a, dimension: user, endpoint: /a/*/b, algorithm: gcra, limit: 5, window: 1s}", []string{"endpoint:", `"*" may only end`}},
		{"bad algorithm", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: magic, limit: 5, window: 1s}", []string{"algorithm: unknown algorithm"}},
		{"zero limit", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 0, window: 1s}", []string{"limit: want a whole number"}},
		{"text limit", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: lots, window: 1s}", []string{`limit: want a whole number from 1 to 1000000000, got "lots"`}},
		{"bad window", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1 minute}", []string{"window: want a Go duration"}},
		{"tiny window", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 10us}", []string{"window:", "outside"}},
		{"burst on window algorithm", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, burst: 9}", []string{"burst: fixed_window counts up to its limit"}},
		{"max_overage of 0", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, max_overage: 0}", []string{"max_overage: want a whole number from 1"}},
		{"max_overage on concurrency", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: concurrency, limit: 5, window: 1s, max_overage: 3}", []string{"max_overage: a concurrency rule holds places"}},
		{"bad shadow", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, shadow: maybe}", []string{"shadow: want true or false"}},
		{"bad fail mode", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, fail_mode: sometimes}", []string{"fail_mode: unknown fail mode"}},
		{"duplicate id", "rules:\n- " + ok + "\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}", []string{`rule "a": id: "a" is used by more than one rule`}},
		{"shared bucket", "rules:\n- " + ok + "\n- {id: b, dimension: user, endpoint: /x, algorithm: gcra, limit: 9, window: 1s}", []string{`duplicates rule "a"`}},
		{"unknown tier", "tiers: {free: {}}\nrules:\n- {id: a, dimension: user, endpoint: /x, tier: gold, algorithm: gcra, limit: 5, window: 1s}", []string{`tier: "gold" is not declared`}},
		{"default tier missing", "tiers: {free: {}, pro: {}}\nrules:\n- " + ok, []string{"default_tier: required"}},
		{"default tier unknown", "default_tier: gold\ntiers: {free: {}}\nrules:\n- " + ok, []string{`default_tier: "gold" is not declared`}},
		{"user unknown tier", "users: {'1': {tier: gold}}\nrules:\n- " + ok, []string{`users["1"]: tier: "gold" is not declared`}},
		{"user limit unknown rule", "users: {'1': {limits: {zz: 5}}}\nrules:\n- " + ok, []string{`users["1"]: limits["zz"]: no rule has this id`}},
		{"user limit on ip rule", "users: {'1': {limits: {b: 5}}}\nrules:\n- " + ok + "\n- {id: b, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}", []string{`limits["b"]: rule counts per ip`}},
		{"prefix on a user rule", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, ipv6_prefix: 64}", []string{`rule "a" (rules[0]): ipv6_prefix: groups the addresses of ip rules; this rule counts per user`}},
		{"ipv6 prefix too long", "rules:\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, ipv6_prefix: 129}", []string{`ipv6_prefix: want a number of leading bits from 1 to 128, got "129"`}},
		{"ipv6 prefix zero", "rules:\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, ipv6_prefix: 0}", []string{`ipv6_prefix: want a number of leading bits from 1 to 128, got "0"`}},
		{"ipv4 prefix too long", "rules:\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, ipv4_prefix: 33}", []string{`ipv4_prefix: want a number of leading bits from 1 to 32, got "33"`}},
		{"ipv4 prefix not a number", "rules:\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, ipv4_prefix: /24}", []string{`ipv4_prefix: want a number of leading bits from 1 to 32, got "/24"`}},
		{"ip rules grouping one family alike", "rules:\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}\n- {id: b, dimension: ip, endpoint: /x, algorithm: gcra, limit: 9, window: 1s, ipv6_prefix: 48}", []string{`duplicates rule "a"`}},
		{"lease on a user rule", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, lease: {slice: 2}}", []string{`rule "a" (rules[0]): lease: only global rules are leased`, "counts per user"}},
		{"lease on gcra", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, lease: {slice: 2}}", []string{`rule "a" (rules[0]): lease: only fixed_window rules are leased`, "this rule is gcra"}},
		{"lease without slice", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, lease: {}}", []string{`rule "a" (rules[0]): lease: slice: required`}},
		{"lease slice zero", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, lease: {slice: 0}}", []string{`lease: slice: want a whole number from 1`}},
		{"lease slice above limit", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, lease: {slice: 6}}", []string{`rule "a" (rules[0]): lease: slice: 6 is more than the limit (5)`}},
		{"lease unknown field", "rules:\n- {id: a, dimension: global, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1s, lease: {slices: 2}}", []string{"slices"}},
		{"ban over a calendar window", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 0, window: 1y}", []string{`rule "a" (rules[0]): limit: 0 (a ban) needs a fixed_window of a fixed length`}},
		{"all problems at once", "rules:\n- {id: a, dimension: 'no pe', endpoint: /x, algorithm: gcra, limit: 0, window: 1s}", []string{"2 problems", "dimension:", "limit:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded, want an error containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(sample), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("Load: %v", err)
	}
	_, err := Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNotExist", err)
	}
	var verr *ValidationError
	os.WriteFile(path, []byte("rules: []"), 0o600)
	if _, err := Load(path); !errors.As(err, &verr) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(invalid) = %v, want a ValidationError naming the file", err)
	}
}

// TestDevRules keeps the shipped example files valid.
func TestDevRules(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"../../deploy/dev/rules.yaml"} {
		if _, err := Load(path); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	s := mustParse(b, sample)
	b.ReportAllocs()
	for b.Loop() {
		if len(s.Match(DimensionUser, "free", "/api/v1/orders/12345/items")) == 0 {
			b.Fatal("no match")
		}
	}
}

// TestThresholdsEnters pins the one test of when a subject goes from normal to warning, which
// the checker's answers and the aggregator's events both apply: used above Enter × limit.
func TestThresholdsEnters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		th          Thresholds
		used, limit int64
		want        bool
	}{
		{DefaultThresholds, 8, 10, false},
		{DefaultThresholds, 9, 10, true},
		{DefaultThresholds, 4, 5, false},
		{DefaultThresholds, 5, 5, true},
		{Thresholds{Enter: 0.9}, 9, 10, false},
		{Thresholds{Enter: 0.9}, 10, 10, true},
		{Thresholds{Enter: 0.9}, 15, 10, true}, // a burst beyond the limit
		{Thresholds{Enter: 0.5}, 0, 0, false},
	}
	for _, tt := range tests {
		if got := tt.th.Enters(tt.used, tt.limit); got != tt.want {
			t.Errorf("Thresholds{Enter: %v}.Enters(%d, %d) = %v, want %v", tt.th.Enter, tt.used, tt.limit, got, tt.want)
		}
	}
}

func TestIPPrefixes(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`rules:
- {id: default, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}
- {id: wide, dimension: ip, endpoint: /x, algorithm: gcra, limit: 9, window: 1s, ipv6_prefix: 48, ipv4_prefix: 24}
- {id: user, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}
`))
	if err != nil {
		t.Fatalf("Parse: %v (rules grouping both families differently share no bucket)", err)
	}
	for _, tt := range []struct {
		id         string
		is4        bool
		want       int
		v6, v4Bits uint8
	}{
		{"default", false, DefaultIPv6Prefix, 0, 0},
		{"default", true, DefaultIPv4Prefix, 0, 0},
		{"wide", false, 48, 48, 24},
		{"wide", true, 24, 48, 24},
	} {
		r, _ := s.Rule(tt.id)
		if got := r.PrefixBits(tt.is4); got != tt.want || r.IPv6Prefix != tt.v6 || r.IPv4Prefix != tt.v4Bits {
			t.Errorf("rule %s: PrefixBits(is4=%v) = %d (fields %d, %d), want %d (%d, %d)", tt.id, tt.is4, got, r.IPv6Prefix, r.IPv4Prefix, tt.want, tt.v6, tt.v4Bits)
		}
	}
}
