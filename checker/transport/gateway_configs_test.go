package transport

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/quotaflow/quotaflow/checker"
)

// Traefik and Envoy are not installed here (TestTraefikConfig says why for Traefik), so these
// tests hold their configs, and the RLS answers Envoy acts on, to what the running gateways'
// tests (gateway_headers_test.go) show of nginx, Caddy and HAProxy: no header a client wrote
// reaches the checker unless the gateway set it, and nothing the checker refuses is let
// through.

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

// envoyBootstrap decodes deploy/envoy/envoy.yaml as go-control-plane's v3 Bootstrap.
func envoyBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
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
	return &bs
}

// envoyHCM decodes deploy/envoy/envoy.yaml's HTTP connection manager.
func envoyHCM(t *testing.T) *hcmv3.HttpConnectionManager {
	t.Helper()
	var hcm hcmv3.HttpConnectionManager
	if err := envoyBootstrap(t).GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	return &hcm
}

// TestEnvoyConfigStripsClientHeaders: every request header a descriptor reads is removed from
// the client's request before the ratelimit filter (header_mutation); an authentication filter
// placed between them may set it from what it verified.
func TestEnvoyConfigStripsClientHeaders(t *testing.T) {
	t.Parallel()
	hcm := envoyHCM(t)
	filters := hcm.GetHttpFilters()
	at := slices.IndexFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == "envoy.filters.http.ratelimit" })
	if at < 0 {
		t.Fatalf("http filters %v: no ratelimit filter", filters)
	}
	removed := map[string]bool{}
	for _, f := range filters[:at] {
		if f.GetName() != "envoy.filters.http.header_mutation" {
			continue
		}
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
}

// TestRLSRefusesPathAsDenial: Envoy serves a request unchecked when quotaflow answers an error
// (failure_mode_deny false), so a path quotaflow cannot check, which the client wrote, is
// answered OVER_LIMIT with the error as the body, charging nothing; an error of the gateway's
// own entries stays InvalidArgument.
func TestRLSRefusesPathAsDenial(t *testing.T) {
	t.Parallel()
	e := newRLSEnv(t, checker.Config{})
	user, ip := id(t, "u"), testIP(t, "client")
	for _, c := range []struct {
		name, path, want string
	}{
		{"over the bound", "/rls/" + strings.Repeat("p", checker.MaxEndpointLen), "must be at most 1024 bytes"},
		{"escaped slash", "/rls/a%2Fb", "descriptors[1].entries[1].value: "},
		{"bad escape", "/rls/%zz", "descriptors[1].entries[1].value: "},
		{"escaped control character", "/rls/%00", "descriptors[1].entries[1].value: "},
		{"relative", "rls/x", "descriptors[1].entries[1].value: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := e.should(t, rlsReq(desc("remote_address", ip), desc("user_id", user, "path", c.path)))
			var body struct{ Error, Message string }
			if err := json.Unmarshal(resp.GetRawBody(), &body); err != nil || body.Error != "invalid_argument" || !strings.Contains(body.Message, c.want) {
				t.Errorf("raw_body = %q (%v), want the invalid_argument JSON error with %q", resp.GetRawBody(), err, c.want)
			}
			codes := make([]ratelimitv3.RateLimitResponse_Code, 0, 2)
			for _, st := range resp.GetStatuses() {
				codes = append(codes, st.GetCode())
			}
			want := []ratelimitv3.RateLimitResponse_Code{ratelimitv3.RateLimitResponse_UNKNOWN, ratelimitv3.RateLimitResponse_OVER_LIMIT}
			if resp.GetOverallCode() != ratelimitv3.RateLimitResponse_OVER_LIMIT || !slices.Equal(codes, want) {
				t.Errorf("answer %s %v, want OVER_LIMIT %v (the address not checked, the path refused)", resp.GetOverallCode(), codes, want)
			}
		})
	}
	// Nothing was charged: the address and the user have their whole limits (rls-ip 2, rls-user 3).
	resp := e.should(t, rlsReq(desc("remote_address", ip), desc("user_id", user, "path", "/rls/x")))
	if got := []uint32{resp.GetStatuses()[0].GetLimitRemaining(), resp.GetStatuses()[1].GetLimitRemaining()}; !slices.Equal(got, []uint32{1, 2}) {
		t.Errorf("after the refused requests, remaining %v, want [1 2]: the first charge", got)
	}
	// A subject the gateway sends is its own: an error, for the operator to see.
	_, err := e.client.ShouldRateLimit(context.Background(), rlsReq(desc("user_id", strings.Repeat("u", checker.MaxIdentifierLen+1), "path", "/rls/x")))
	if status.Code(err) != grpccodes.InvalidArgument {
		t.Errorf("a subject over the bound: %v, want InvalidArgument", err)
	}
}
