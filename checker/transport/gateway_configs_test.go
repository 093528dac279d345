package transport

import (
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/proctest"
)

// Traefik and Envoy are not installed here (TestTraefikConfig says why for Traefik), so these
// tests hold their configs to what the running gateways' tests (gateway_headers_test.go) show
// of nginx, Caddy and HAProxy: no header a client wrote reaches the checker unless the gateway
// set it, and nothing the checker refuses is let through.

// TestTraefikStripsClientHeaders: Traefik's forwardAuth passes the checker only the request
// headers listed in authRequestHeaders (and writes X-Forwarded-* itself, trustForwardHeader
// false). The list holds only the subjects and Accept, and each subject header is removed from
// the client's request by a headers middleware before the check (an authentication middleware
// between them may set it).
func TestTraefikStripsClientHeaders(t *testing.T) {
	t.Parallel()
	var dyn traefikDynamic
	if err := decodeStrict(filepath.Join(deployDir, "traefik", "dynamic.yml"), &dyn); err != nil {
		t.Fatal(err)
	}
	subjects := []string{"X-User-Id", "X-Api-Key"}
	for name, r := range dyn.HTTP.Routers {
		stripped := map[string]bool{}
		for _, m := range r.Middlewares {
			mw := dyn.HTTP.Middlewares[m]
			if mw.Headers != nil {
				for h, v := range mw.Headers.CustomRequestHeaders {
					if v == "" { // Traefik's way of removing a header
						stripped[strings.ToLower(h)] = true
					}
				}
			}
			fa := mw.ForwardAuth
			if fa == nil {
				continue
			}
			if u, err := url.Parse(fa.Address); err != nil || u.Path != "/ratelimit/check" {
				continue // some other forwardAuth: an authentication middleware
			}
			if fa.TrustForwardHeader {
				t.Errorf("router %s, middleware %s: trustForwardHeader true passes the client's X-Forwarded-For on", name, m)
			}
			for _, h := range fa.AuthRequestHeaders {
				switch {
				case slices.ContainsFunc(subjects, func(s string) bool { return strings.EqualFold(s, h) }):
					if !stripped[strings.ToLower(h)] {
						t.Errorf("router %s, middleware %s: %s reaches the checker as the client wrote it, want it removed by a headers middleware before", name, m, h)
					}
				case strings.EqualFold(h, "Accept"):
				default:
					t.Errorf("router %s, middleware %s: authRequestHeaders has %s, which the checker would believe from the client; want only %v and Accept", name, m, h, subjects)
				}
			}
		}
	}
}

// envoyHCM decodes deploy/envoy/envoy.yaml's HTTP connection manager.
func envoyHCM(t *testing.T) *hcmv3.HttpConnectionManager {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("yaml: %v", err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("yaml to json: %v", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("envoy.yaml is not a v3 Bootstrap: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	return &hcm
}

// TestEnvoyConfigGuardsTheCheck: Envoy's ratelimit filter lets a request through when quotaflow
// answers an error (failure_mode_deny false, the fail-open setting), and cannot tell an error
// from an outage. So before it, every request header a descriptor reads is removed from the
// client's request (header_mutation), and a path quotaflow would refuse is answered 400 (lua).
// The Lua runs here in HAProxy's Lua 5.3 (Envoy's is LuaJIT, Lua 5.1: the code uses only what
// both have), against a stand-in of Envoy's request handle.
func TestEnvoyConfigGuardsTheCheck(t *testing.T) {
	t.Parallel()
	hcm := envoyHCM(t)
	filters := hcm.GetHttpFilters()
	at := slices.IndexFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == "envoy.filters.http.ratelimit" })
	if at < 0 {
		t.Fatalf("http filters %v: no ratelimit filter", filters)
	}
	removed := map[string]bool{}
	var lua *luav3.Lua
	for _, f := range filters[:at] {
		switch f.GetName() {
		case "envoy.filters.http.header_mutation":
			var hm headermutationv3.HeaderMutation
			if err := f.GetTypedConfig().UnmarshalTo(&hm); err != nil {
				t.Fatal(err)
			}
			if err := hm.ValidateAll(); err != nil {
				t.Fatalf("header_mutation: %v", err)
			}
			if d := deprecatedFields(hm.ProtoReflect(), nil); len(d) > 0 {
				t.Errorf("header_mutation sets deprecated fields %v", d) // Envoy refuses them by default
			}
			for _, m := range hm.GetMutations().GetRequestMutations() {
				if r := m.GetRemove(); r != "" {
					removed[strings.ToLower(r)] = true
				}
			}
		case "envoy.filters.http.lua":
			lua = new(luav3.Lua)
			if err := f.GetTypedConfig().UnmarshalTo(lua); err != nil {
				t.Fatal(err)
			}
			if err := lua.ValidateAll(); err != nil {
				t.Fatalf("lua: %v", err)
			}
			if d := deprecatedFields(lua.ProtoReflect(), nil); len(d) > 0 {
				t.Errorf("lua sets deprecated fields %v", d)
			}
		}
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, limit := range r.GetRoute().GetRateLimits() {
				for _, a := range limit.GetActions() {
					rh, ok := a.GetActionSpecifier().(*routev3.RateLimit_Action_RequestHeaders_)
					if !ok {
						continue
					}
					name := strings.ToLower(rh.RequestHeaders.GetHeaderName())
					if !strings.HasPrefix(name, ":") && !removed[name] {
						t.Errorf("descriptor key %s reads the client's %s: want it removed before the ratelimit filter (header_mutation)",
							rh.RequestHeaders.GetDescriptorKey(), name)
					}
				}
			}
		}
	}
	for _, h := range []string{"x-user-id", "x-api-key"} {
		if !removed[h] {
			t.Errorf("%s is not removed before the ratelimit filter: docs/envoy.md's descriptors read it", h)
		}
	}
	if lua == nil {
		t.Fatal("no lua filter before the ratelimit filter: a path quotaflow refuses would be let through")
	}
	code := lua.GetDefaultSourceCode().GetInlineString()
	long := strings.Repeat("a", checker.MaxEndpointLen)
	for _, c := range []struct {
		path string
		want string // the status answered, or "" for none: the request goes on to be checked
	}{
		{"/" + long[1:], ""},
		{"/" + long, "400"},
		{"/" + long[1:] + "?q=" + long, ""},
		{"/orders?q=caf\xc3\xa9", ""},
		{"/caf\xc3\xa9", "400"},
		{"/a\x7f", "400"},
		{"/a\x01b", "400"},
		{"/api/v1/search?q=x", ""},
	} {
		if got := runEnvoyLua(t, code, c.path); got != c.want {
			t.Errorf("envoy_on_request with :path %.40q (%d bytes) answered %q, want %q", c.path, len(c.path), got, c.want)
		}
	}
}

// runEnvoyLua runs code's envoy_on_request against a request handle whose :path is path, in
// HAProxy's Lua (lua-load runs a file as the configuration is read, so haproxy -c runs it),
// and returns the status it responded with, or "".
func runEnvoyLua(t *testing.T, code, path string) string {
	t.Helper()
	dir := t.TempDir()
	harness := code + `
local status = ""
local request = {}
function request:headers()
  return { get = function(_, name) if name == ":path" then return os.getenv("ENVOY_PATH") end end }
end
function request:respond(headers, body)
  status = headers[":status"]
end
envoy_on_request(request)
local out = assert(io.open(os.getenv("ENVOY_OUT"), "w"))
out:write(status)
out:close()
`
	if err := os.WriteFile(filepath.Join(dir, "envoy.lua"), []byte(harness), 0o600); err != nil {
		t.Fatal(err)
	}
	// A listener, never bound (-c only reads the configuration): without one haproxy -c exits 2.
	cfg := "global\n    lua-load " + filepath.Join(dir, "envoy.lua") + "\n" +
		"listen check\n    mode http\n    bind 127.0.0.1:9\n    timeout client 1s\n    timeout connect 1s\n    timeout server 1s\n"
	if err := os.WriteFile(filepath.Join(dir, "haproxy.cfg"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := proctest.LookPath("haproxy", sbin)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "status")
	cmd := exec.Command(bin, "-c", "-q", "-f", filepath.Join(dir, "haproxy.cfg"))
	cmd.Env = append(os.Environ(), "ENVOY_PATH="+path, "ENVOY_OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run the lua filter in haproxy: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the lua filter did not finish: %v", err)
	}
	return string(got)
}
