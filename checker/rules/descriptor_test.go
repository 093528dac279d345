package rules

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const descriptorRules = `
rules:
  - {id: tenant, dimension: tenant, endpoint: /api/*, algorithm: gcra, limit: 5, window: 1s}
  - {id: pair, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 1, window: 1m, count_denied: true,
     descriptor: [{key: source_cluster, value: proxy}, {key: destination_cluster, value: mock}]}
  - {id: any-dest, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 2, window: 1m,
     descriptor: [{key: source_cluster, value: proxy}, {key: destination_cluster}]}
  - {id: wild, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 3, window: 1m,
     descriptor: [{key: path, value: "/files/*"}]}
  - {id: foo, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 4, window: 1m, descriptor: [{key: foo}]}
  - {id: free, dimension: descriptor, endpoint: /rl, unlimited: true, descriptor: [{key: foo}, {key: bay}]}
  - {id: banned, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 0, window: 1m, name: ban,
     descriptor: [{key: foo}, {key: bar, value: banned}]}
  - {id: logs, dimension: descriptor, endpoint: /rl, algorithm: fixed_window, limit: 3, window: 1m,
     descriptor: [{key: bucket, value: "logs-*", shared: true}, {key: op}]}
`

// TestMatchDescriptor matches descriptors as envoyproxy/ratelimit walks its configuration: the
// exact value, then a prefix, then the key alone, and only a descriptor that ends at a rule.
func TestMatchDescriptor(t *testing.T) {
	t.Parallel()
	s := mustParse(t, descriptorRules)
	tests := []struct {
		name     string
		endpoint string
		entries  []Entry
		want     string // rule id, "" for none
	}{
		{"custom dimension", "/api/v1/x", []Entry{{"tenant", "acme"}}, "tenant"},
		{"custom dimension at another endpoint", "/other", []Entry{{"tenant", "acme"}}, ""},
		{"custom dimension among more entries", "/api/v1/x", []Entry{{"tenant", "acme"}, {"class", "bot"}}, ""},
		{"exact path", "/rl", []Entry{{"source_cluster", "proxy"}, {"destination_cluster", "mock"}}, "pair"},
		{"value-less second entry", "/rl", []Entry{{"source_cluster", "proxy"}, {"destination_cluster", "other"}}, "any-dest"},
		{"first entry's value differs", "/rl", []Entry{{"source_cluster", "edge"}, {"destination_cluster", "mock"}}, ""},
		{"shorter than the rule", "/rl", []Entry{{"source_cluster", "proxy"}}, ""},
		{"wildcard value", "/rl", []Entry{{"path", "/files/a.txt"}}, "wild"},
		{"wildcard miss", "/rl", []Entry{{"path", "/other"}}, ""},
		{"key alone", "/rl", []Entry{{"foo", "x"}}, "foo"},
		{"unlimited below", "/rl", []Entry{{"foo", "x"}, {"bay", "y"}}, "free"},
		{"zero limit", "/rl", []Entry{{"foo", "x"}, {"bar", "banned"}}, "banned"},
		{"deeper than the tree", "/rl", []Entry{{"foo", "x"}, {"bar", "banned"}, {"z", "1"}}, ""},
		{"no entries", "/rl", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ""
			if r, _ := s.MatchDescriptor(s.DefaultTier(), tt.endpoint, tt.entries); r != nil {
				got = r.ID
			}
			if got != tt.want {
				t.Errorf("MatchDescriptor(%s, %v) = %q, want %q", tt.endpoint, tt.entries, got, tt.want)
			}
		})
	}
	// A shared wildcard names the bucket by its pattern; the other entries keep their values.
	r, bucket := s.MatchDescriptor(s.DefaultTier(), "/rl", []Entry{{"bucket", "logs-eu"}, {"op", "put"}})
	if r == nil || r.ID != "logs" || fmt.Sprint(bucket) != "[bucket=logs-* op=put]" {
		t.Errorf("shared wildcard: rule %v, bucket entries %v; want logs, [bucket=logs-* op=put]", r, bucket)
	}
	if _, bucket := s.MatchDescriptor(s.DefaultTier(), "/rl", []Entry{{"path", "/files/a"}}); fmt.Sprint(bucket) != "[path=/files/a]" {
		t.Errorf("a wildcard that does not share: bucket entries %v, want the descriptor's own", bucket)
	}
	if !s.DescriptorDomain("/rl") || s.DescriptorDomain("/api/*") || s.DescriptorDomain("/api/v1/x") {
		t.Error("DescriptorDomain: want /rl only (a descriptor rule's exact endpoint)")
	}
	if r, _ := s.Rule("banned"); r.Limit != 0 || r.Name != "ban" {
		t.Errorf("banned: limit %d name %q, want 0 and ban", r.Limit, r.Name)
	}
}

func TestDescriptorRuleErrors(t *testing.T) {
	t.Parallel()
	const fw = "algorithm: fixed_window, limit: 5, window: 1m"
	tests := []struct {
		name, rule, want string
	}{
		{"typo of a dimension", "{id: a, dimension: users, endpoint: /x, " + fw + "}", `dimension: unknown dimension "users"`},
		{"descriptor without entries", "{id: a, dimension: descriptor, endpoint: /x, " + fw + "}", "descriptor: want 1 to 16 entries, got 0"},
		{"descriptor on a user rule", "{id: a, dimension: user, endpoint: /x, " + fw + ", descriptor: [{key: k}]}", "descriptor: only descriptor rules"},
		{"custom dimension with a descriptor", "{id: a, dimension: tenant, endpoint: /x, " + fw + ", descriptor: [{key: k}]}", "descriptor: a custom dimension (tenant)"},
		{"empty key", "{id: a, dimension: descriptor, endpoint: /x, " + fw + ", descriptor: [{key: ''}]}", "descriptor[0].key: required"},
		{"unlimited with a limit", "{id: a, dimension: descriptor, endpoint: /x, unlimited: true, limit: 5, descriptor: [{key: k}]}", "limit: an unlimited rule has none"},
		{"name on a user rule", "{id: a, dimension: user, endpoint: /x, " + fw + ", name: n}", "name: only descriptor rules take one"},
		{"replaces itself", "{id: a, dimension: tenant, endpoint: /x, " + fw + ", name: n, replaces: [n]}", `replaces[0]: "n" is this rule's own name`},
		{"count_denied on gcra", "{id: a, dimension: tenant, endpoint: /x, algorithm: gcra, limit: 5, window: 1m, count_denied: true}", "count_denied: only a fixed_window"},
		{"zero gcra", "{id: a, dimension: tenant, endpoint: /x, algorithm: gcra, limit: 0, window: 1m}", "limit: want a whole number from 1"},
		{"shared without a wildcard", "{id: a, dimension: descriptor, endpoint: /x, " + fw + ", descriptor: [{key: k, value: v, shared: true}]}", "descriptor[0].shared: only a wildcard value"},
		{"quota mode on a user rule", "{id: a, dimension: user, endpoint: /x, " + fw + ", quota_mode: true}", "quota_mode: only descriptor rules take one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte("rules:\n- " + tt.rule))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestImportEnvoy converts a configuration of the reference's form into rules that compile.
func TestImportEnvoy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := `domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-tenant}
    descriptors:
      - key: plan
        value: free
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 0, unit_multiplier: 2, replaces: [{name: per-tenant}]}
      - key: plan
        value: trial
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
`
	if err := os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	doc, err := ImportEnvoy(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := doc.Compile()
	if err != nil {
		t.Fatalf("compiling the converted rules: %v", err)
	}
	r, _ := s.MatchDescriptor(s.DefaultTier(), "/shop", []Entry{{"tenant", "acme"}, {"plan", "free"}})
	if r == nil || r.Limit != 0 || r.Window.Hours() != 2 || !r.Shadow || !r.CountDenied || len(r.Replaces) != 1 || r.Replaces[0] != "per-tenant" {
		t.Errorf("tenant/plan rule = %+v, want 0 per 2h, shadow, counted, replacing per-tenant", r)
	}
	if r, _ := s.MatchDescriptor(s.DefaultTier(), "/shop", []Entry{{"tenant", "acme"}}); r == nil || r.ID != "per-tenant" || r.Limit != 5 {
		t.Errorf("tenant rule = %+v, want per-tenant, 5 per minute", r)
	}
	if r, _ := s.MatchDescriptor(s.DefaultTier(), "/shop", []Entry{{"tenant", "acme"}, {"plan", "trial"}}); r == nil || !r.QuotaMode || !r.Shadow {
		t.Errorf("tenant/trial rule = %+v, want quota mode, which never denies", r)
	}
	if r, _ := s.MatchDescriptor(s.DefaultTier(), "/shop", []Entry{{"health", "x"}}); r == nil || !r.Unlimited {
		t.Errorf("health rule = %+v, want unlimited", r)
	}
}

// TestImportEnvoyErrors: a bad configuration is refused naming the file, the line and the field.
func TestImportEnvoyErrors(t *testing.T) {
	t.Parallel()
	_, err := ImportEnvoy("testdata/envoy/bad.yaml")
	for _, want := range []string{
		`testdata/envoy/bad.yaml: line 5: descriptors[0].rate_limit.unit: invalid rate limit unit "minutes"`,
		`testdata/envoy/bad.yaml: line 11: descriptors[1].rate_limit.unit: an unlimited limit has no unit`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error containing %q", err, want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limits: {}\n"), 0o644)
	if _, err := ImportEnvoy(dir); err == nil || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "rate_limits") {
		t.Errorf("unknown field: got %v, want it named with its file", err)
	}
}

func TestExemptionErrors(t *testing.T) {
	t.Parallel()
	const rule = "rules:\n- {id: r, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1m}\nexemptions:\n- "
	tests := []struct {
		name, exemption, want string
	}{
		{"no dimension", "{id: a, value: v}", "exemptions[0]: dimension: required"},
		{"global", "{id: a, dimension: global, value: v}", "exemptions[0]: dimension: global subjects cannot be exempt"},
		{"bad network", "{id: a, dimension: ip, value: 10.0.0.0/33}", `exemptions[0]: value: "10.0.0.0/33" is neither an address nor a CIDR`},
		{"unknown rule", "{id: a, dimension: user, value: u, rules: [nope]}", `exemptions[0]: rules[0]: no rule has id "nope"`},
		{"no value", "{id: a, dimension: apikey}", "exemptions[0]: value: required"},
		{"bad id", "{id: 'a b', dimension: user, value: u}", "exemptions[0]: id: required, and must match"},
		{"typo of a dimension", "{id: a, dimension: users, value: u}", `exemptions[0]: dimension: unknown dimension "users"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(rule + tt.exemption))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := Parse([]byte(rule + "{id: a, dimension: user, value: u}\n- {id: a, dimension: ip, value: 10.0.0.1}")); err == nil || !strings.Contains(err.Error(), `id: "a" is used by more than one exemption`) {
		t.Errorf("duplicate id: got %v", err)
	}
}

// TestExemptionOrder: of several exemptions matching one check, the first in the document
// applies, whatever kinds of subject they name.
func TestExemptionOrder(t *testing.T) {
	t.Parallel()
	s := mustParse(t, `
rules:
- {id: r, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1m}
exemptions:
- {id: tenant-first, dimension: tenant, value: acme, rules: [r]}
- {id: net, dimension: ip, value: 10.0.0.0/8}
- {id: bob, dimension: user, value: bob}
`)
	ip := netip.MustParseAddr("10.1.2.3")
	acme := []Entry{{Key: "tenant", Value: "acme"}}
	for _, tt := range []struct {
		user    string
		ip      netip.Addr
		entries []Entry
		want    string
	}{
		{"bob", ip, acme, "tenant-first"},
		{"bob", ip, nil, "net"},
		{"bob", netip.Addr{}, nil, "bob"},
		{"alice", netip.MustParseAddr("192.0.2.1"), []Entry{{Key: "tenant", Value: "other"}}, ""},
	} {
		got := ""
		if e := s.Exemption(tt.user, "", tt.ip, tt.entries); e != nil {
			got = e.ID
		}
		if got != tt.want {
			t.Errorf("Exemption(%s, %v, %v) = %q, want %q", tt.user, tt.ip, tt.entries, got, tt.want)
		}
	}
}
