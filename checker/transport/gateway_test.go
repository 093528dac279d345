package transport

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// deployDir is the repository's deploy folder: the tests run the configs users copy.
const deployDir = "../../deploy"

// sbin is where Debian installs nginx and haproxy, which a user's PATH may lack.
var sbin = []string{"/usr/sbin", "/usr/local/sbin"}

// The shipped configs send the checker the subjects the gateway authenticated, never a
// client's X-User-Id or X-Api-Key. A test gateway's stand-in for authentication (basic auth, a
// JWT's claim) is these headers, read through the config's own setting for it
// ($quotaflow_user, QUOTAFLOW_USER, ...): what a client sends here is who it is.
const (
	testUserHeader   = "X-Test-User"    // nginx: $http_x_test_user
	testAPIKeyHeader = "X-Test-Api-Key" // nginx: $http_x_test_api_key
)

// gatewayKind knows how to run one gateway with the repository's config in front of a checker
// (host:port) and an upstream app (host:port), failing open or closed while the checker is down.
type gatewayKind struct {
	name  string
	setup func(dir string, port int, checker, app, failMode string) (proctest.Config, error)
}

var gatewayKinds = []gatewayKind{
	{"nginx", nginxSetup},
	{"caddy", caddySetup},
	{"haproxy", haproxySetup},
}

// gateway is a running gateway process.
type gateway struct {
	p   *proctest.Process
	url string
}

// startGateway runs kind on a free port, its config, pid and logs in a temporary folder that
// goes with the test. failMode is "open" or "closed".
func startGateway(t *testing.T, kind gatewayKind, checker, app, failMode string) *gateway {
	t.Helper()
	g, err := proctest.Start(kind.name, 1, func(p *proctest.Process, dir string, ports []int) (*gateway, proctest.Config, error) {
		cfg, err := kind.setup(dir, ports[0], checker, app, failMode)
		return &gateway{p: p, url: "http://" + proctest.Addr(ports[0])}, cfg, err
	})
	if err != nil {
		t.Fatalf("start %s: %v", kind.name, err)
	}
	t.Cleanup(g.p.Close)
	return g
}

func absDeploy(parts ...string) (string, error) {
	p, err := filepath.Abs(filepath.Join(append([]string{deployDir}, parts...)...))
	if err != nil {
		return "", fmt.Errorf("find the deploy folder: %w", err)
	}
	return p, nil
}

// nginxSetup runs nginx in the foreground as one process (no master, so that the kill that
// stops it leaves no worker behind), including deploy/nginx's snippets as a user would.
func nginxSetup(dir string, port int, checker, app, failMode string) (proctest.Config, error) {
	snippets, err := absDeploy("nginx")
	if err != nil {
		return proctest.Config{}, err
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream quotaflow_checker { server %[2]s; keepalive 4; }
    upstream app { server %[3]s; }
    server {
        listen %[4]s;
        set $quotaflow_upstream http://app;
        set $quotaflow_fail_mode %[6]s;
        set $quotaflow_user $http_x_test_user;
        set $quotaflow_api_key $http_x_test_api_key;
        include %[5]s/quotaflow.conf;
        location / {
            include %[5]s/quotaflow-location.conf;
            proxy_pass http://app;
        }
    }
}
`, dir, checker, app, proctest.Addr(port), snippets, failMode)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return proctest.Config{}, fmt.Errorf("write nginx.conf: %w", err)
	}
	return proctest.Config{
		Name:     "nginx",
		Path:     "nginx",
		Search:   sbin,
		Args:     []string{"-p", dir + "/", "-c", path, "-e", filepath.Join(dir, "error.log")},
		LogFiles: []string{filepath.Join(dir, "error.log")},
		Ready:    proctest.Listening(proctest.Addr(port)),
	}, nil
}

// caddySetup runs deploy/caddy/Caddyfile as it is, its addresses from the environment.
func caddySetup(dir string, port int, checker, app, failMode string) (proctest.Config, error) {
	path, err := absDeploy("caddy", "Caddyfile")
	if err != nil {
		return proctest.Config{}, err
	}
	return proctest.Config{
		Name:   "caddy",
		Path:   "caddy",
		Search: sbin,
		Args:   []string{"run", "--config", path, "--adapter", "caddyfile"},
		// Caddy keeps its state under XDG_DATA_HOME and XDG_CONFIG_HOME (HOME without them):
		// the test's folder, not the user's.
		Env: []string{"QUOTAFLOW_LISTEN=" + proctest.Addr(port), "QUOTAFLOW_CHECKER=" + checker, "QUOTAFLOW_APP=" + app,
			"QUOTAFLOW_FAIL_MODE=" + failMode, "QUOTAFLOW_USER={http.request.header." + testUserHeader + "}",
			"QUOTAFLOW_API_KEY={http.request.header." + testAPIKeyHeader + "}", "HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir},
		Ready: proctest.Listening(proctest.Addr(port)),
	}, nil
}

// haproxySetup runs deploy/haproxy/haproxy.cfg as it is, in the foreground (-db), from its
// folder (where lua-load finds quotaflow.lua), its addresses from the environment.
func haproxySetup(dir string, port int, checker, app, failMode string) (proctest.Config, error) {
	folder, err := absDeploy("haproxy")
	if err != nil {
		return proctest.Config{}, err
	}
	return proctest.Config{
		Name:   "haproxy",
		Path:   "haproxy",
		Search: sbin,
		Args:   []string{"-db", "-f", filepath.Join(folder, "haproxy.cfg")},
		Dir:    folder,
		Env: []string{"QUOTAFLOW_LISTEN=" + proctest.Addr(port), "QUOTAFLOW_CHECKER=" + checker, "QUOTAFLOW_APP=" + app, "QUOTAFLOW_FAIL_MODE=" + failMode,
			"QUOTAFLOW_USER=req.hdr(" + testUserHeader + ")", "QUOTAFLOW_API_KEY=req.hdr(" + testAPIKeyHeader + ")"},
		Ready: proctest.Listening(proctest.Addr(port)),
	}, nil
}

// app is the upstream behind a gateway: it counts the requests that reach it.
type app struct {
	srv  *httptest.Server
	hits atomic.Int64
}

func newApp(t *testing.T) *app {
	a := &app{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.hits.Add(1)
		io.WriteString(w, "app "+r.URL.Path)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) addr() string { return strings.TrimPrefix(a.srv.URL, "http://") }

// gatewayGet is gatewayDo as the test's authenticated user, with a forged RateLimit field of
// the client's, which must not reach the response as the checker's.
func gatewayGet(t *testing.T, base, path, user string) (*http.Response, string) {
	t.Helper()
	return gatewayDo(t, base, path, http.Header{testUserHeader: {user}, "Ratelimit": {`"forged";r=999;t=1`}})
}

// TestGateways runs each gateway with the repository's config in front of a real checker and a
// real upstream: allowed requests reach the upstream and carry the RateLimit headers, a denial
// reaches the client as 429 with Retry-After and the headers, and with the checker down the
// gateway fails open or closed as configured.
func TestGateways(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	u, err := url.Parse(env.url)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := proctest.FreePort() // nothing listens there: a checker that is down
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range gatewayKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			a := newApp(t)
			gw := startGateway(t, kind, u.Host, a.addr(), "open")
			user := id(t, "u")
			// user-tb allows 3 an hour.
			for i := range 3 {
				resp, body := gatewayGet(t, gw.url, "/tb", user)
				if resp.StatusCode != http.StatusOK || body != "app /tb" {
					t.Fatalf("call %d = %d %q, want 200 from the upstream", i+1, resp.StatusCode, body)
				}
				wantHeaders(t, resp.Header, map[string]string{
					"RateLimit":             `^"user-tb";r=` + strconv.Itoa(2-i) + `;t=\d+$`,
					"RateLimit-Policy":      `^"user-tb";q=3;w=3600$`,
					"X-RateLimit-Limit":     `^3$`,
					"X-RateLimit-Remaining": `^` + strconv.Itoa(2-i) + `$`,
					"X-RateLimit-Reset":     `^\d+$`,
				})
			}
			resp, body := gatewayGet(t, gw.url, "/tb", user)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("fourth call = %d %q, want 429", resp.StatusCode, body)
			}
			wantHeaders(t, resp.Header, map[string]string{
				"Retry-After":           `^[1-9]\d*$`,
				"RateLimit":             `^"user-tb";r=0;t=\d+$`,
				"RateLimit-Policy":      `^"user-tb";q=3;w=3600$`,
				"X-RateLimit-Limit":     `^3$`,
				"X-RateLimit-Remaining": `^0$`,
				"X-RateLimit-Reset":     `^\d+$`,
			})
			var answer struct {
				Error      string `json:"error"`
				Allowed    *bool  `json:"allowed"`
				RetryAfter int64  `json:"retry_after"`
			}
			if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.Error != "rate_limit_exceeded" ||
				answer.Allowed == nil || *answer.Allowed || strconv.FormatInt(answer.RetryAfter, 10) != resp.Header.Get("Retry-After") {
				t.Errorf("429 body = %q (%v), want the rate_limit_exceeded JSON answer with retry_after %s", body, err, resp.Header.Get("Retry-After"))
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("429 Content-Type = %q, want application/json", got)
			}
			if got := a.hits.Load(); got != 3 {
				t.Errorf("upstream reached %d times, want 3: the denial must not reach it", got)
			}

			// No rule matches /free: no RateLimit fields, and none a client sent either.
			resp, body = gatewayGet(t, gw.url, "/free", user)
			if resp.StatusCode != http.StatusOK || body != "app /free" {
				t.Errorf("unlimited call = %d %q, want 200 from the upstream", resp.StatusCode, body)
			}
			for _, name := range []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Remaining", "Retry-After"} {
				if got := resp.Header.Values(name); len(got) > 0 {
					t.Errorf("unlimited call: %s = %q, want none", name, got)
				}
			}

			down := startGateway(t, kind, proctest.Addr(dead), a.addr(), "open")
			resp, body = gatewayGet(t, down.url, "/tb", user)
			if resp.StatusCode != http.StatusOK || body != "app /tb" || resp.Header.Get("X-RateLimit-Degraded") != "true" {
				t.Errorf("with the checker down = %d %q (X-RateLimit-Degraded %q), want 200 from the upstream, degraded (fail open)",
					resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
			}
			if got := a.hits.Load(); got != 5 {
				t.Errorf("upstream reached %d times, want 5", got)
			}

			closed := startGateway(t, kind, proctest.Addr(dead), a.addr(), "closed")
			resp, body = gatewayGet(t, closed.url, "/tb", user)
			var refusal struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &refusal); resp.StatusCode != http.StatusServiceUnavailable || err != nil ||
				refusal.Error != "rate_limiter_unavailable" || resp.Header.Get("X-RateLimit-Degraded") != "true" {
				t.Errorf("with the checker down, failing closed = %d %q (X-RateLimit-Degraded %q), want 503 with the rate_limiter_unavailable JSON answer, degraded",
					resp.StatusCode, body, resp.Header.Get("X-RateLimit-Degraded"))
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("fail-closed Content-Type = %q, want application/json", got)
			}
			if got := a.hits.Load(); got != 5 {
				t.Errorf("upstream reached %d times, want 5: failing closed must not reach it", got)
			}

			// A rule that delays (user-delay: a slot every 200 ms): the second request goes on
			// at its slot, 200 ms after the first's decision at the earliest. nginx and Caddy
			// ask the checker to answer then (?wait=true); HAProxy's action sleeps the delay.
			delayed := id(t, "d")
			start := time.Now()
			for i := range 2 {
				if resp, body := gatewayGet(t, gw.url, "/delay", delayed); resp.StatusCode != http.StatusOK || body != "app /delay" {
					t.Fatalf("delayed call %d = %d %q, want 200 from the upstream", i+1, resp.StatusCode, body)
				}
			}
			if took := time.Since(start); took < 200*time.Millisecond {
				t.Errorf("two calls of a 200ms queue went through in %v, want the second at its slot (200ms after the first)", took)
			} else {
				t.Logf("two calls of a 200ms queue went through in %v", took)
			}
		})
	}
}

// wantHeaders checks each header against its pattern.
func wantHeaders(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for name, pattern := range want {
		if got := h.Get(name); !regexp.MustCompile(pattern).MatchString(got) {
			t.Errorf("%s = %q, want %s", name, got, pattern)
		}
	}
}

// Traefik's configuration schema, as its Go types declare it (github.com/traefik/traefik/v3
// v3.1.2, pkg/config/dynamic and pkg/config/static), cut to the parts deploy/traefik uses.
// Traefik is not packaged and its module cannot be built with go install (replace directives),
// so the config is checked here against the schema instead of by a running Traefik: decoding
// with KnownFields rejects any key Traefik does not know.
type (
	traefikDynamic struct {
		HTTP struct {
			Routers     map[string]traefikRouter     `yaml:"routers"`
			Middlewares map[string]traefikMiddleware `yaml:"middlewares"`
			Services    map[string]traefikService    `yaml:"services"`
		} `yaml:"http"`
	}
	traefikRouter struct {
		EntryPoints []string `yaml:"entryPoints"`
		Middlewares []string `yaml:"middlewares"`
		Service     string   `yaml:"service"`
		Rule        string   `yaml:"rule"`
		RuleSyntax  string   `yaml:"ruleSyntax"`
		Priority    int      `yaml:"priority"`
	}
	traefikMiddleware struct {
		Headers *struct {
			CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
		} `yaml:"headers"`
		ForwardAuth *struct {
			Address string `yaml:"address"`
			TLS     *struct {
				CA                 string `yaml:"ca"`
				Cert               string `yaml:"cert"`
				Key                string `yaml:"key"`
				InsecureSkipVerify bool   `yaml:"insecureSkipVerify"`
			} `yaml:"tls"`
			TrustForwardHeader       bool     `yaml:"trustForwardHeader"`
			AuthResponseHeaders      []string `yaml:"authResponseHeaders"`
			AuthResponseHeadersRegex string   `yaml:"authResponseHeadersRegex"`
			AuthRequestHeaders       []string `yaml:"authRequestHeaders"`
			AddAuthCookiesToResponse []string `yaml:"addAuthCookiesToResponse"`
		} `yaml:"forwardAuth"`
	}
	traefikService struct {
		LoadBalancer *struct {
			Servers []struct {
				URL string `yaml:"url"`
			} `yaml:"servers"`
			PassHostHeader *bool `yaml:"passHostHeader"`
		} `yaml:"loadBalancer"`
	}
	traefikStatic struct {
		EntryPoints map[string]struct {
			Address string `yaml:"address"`
		} `yaml:"entryPoints"`
		Providers struct {
			File *struct {
				Directory string `yaml:"directory"`
				Filename  string `yaml:"filename"`
				Watch     bool   `yaml:"watch"`
			} `yaml:"file"`
		} `yaml:"providers"`
		Log struct {
			Level string `yaml:"level"`
		} `yaml:"log"`
	}
)

// decodeStrict decodes the YAML file into v, failing on any key v's type lacks.
func decodeStrict(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// TestTraefikConfig checks deploy/traefik against Traefik's schema and the forward-auth
// endpoint's contract: the check URL, the headers the checker reads, the answer's headers
// copied, and every name the router uses defined.
func TestTraefikConfig(t *testing.T) {
	t.Parallel()
	var static traefikStatic
	if err := decodeStrict(filepath.Join(deployDir, "traefik", "traefik.yml"), &static); err != nil {
		t.Fatal(err)
	}
	var dyn traefikDynamic
	if err := decodeStrict(filepath.Join(deployDir, "traefik", "dynamic.yml"), &dyn); err != nil {
		t.Fatal(err)
	}
	if static.Providers.File == nil || static.Providers.File.Filename != "deploy/traefik/dynamic.yml" {
		t.Errorf("static providers.file = %+v, want filename deploy/traefik/dynamic.yml", static.Providers.File)
	}
	if len(dyn.HTTP.Routers) == 0 {
		t.Fatal("dynamic.yml has no router")
	}
	for name, r := range dyn.HTTP.Routers {
		for _, ep := range r.EntryPoints {
			if _, ok := static.EntryPoints[ep]; !ok {
				t.Errorf("router %s: entry point %q is not in traefik.yml", name, ep)
			}
		}
		if _, ok := dyn.HTTP.Services[r.Service]; !ok || dyn.HTTP.Services[r.Service].LoadBalancer == nil {
			t.Errorf("router %s: service %q has no loadBalancer", name, r.Service)
		}
		forwardAuths := 0
		for _, m := range r.Middlewares {
			mw, ok := dyn.HTTP.Middlewares[m]
			if ok && mw.Headers != nil {
				continue // TestTraefikStripsClientHeaders
			}
			if !ok || mw.ForwardAuth == nil {
				t.Errorf("router %s: middleware %q is neither a forwardAuth nor a headers", name, m)
				continue
			}
			forwardAuths++
			fa := mw.ForwardAuth
			u, err := url.Parse(fa.Address)
			if err != nil || u.Scheme != "http" || u.Host == "" || u.Path != "/ratelimit/check" {
				t.Errorf("forwardAuth address = %q, want http://<checker>/ratelimit/check", fa.Address)
			}
			// Traefik passes any non-2xx answer to the client: the checker's 429 stays.
			if u != nil && u.Query().Has("deny_status") {
				t.Errorf("forwardAuth address = %q, want no deny_status: Traefik passes 429 on", fa.Address)
			}
			for _, want := range []string{"X-User-Id", "X-Api-Key"} {
				if !slices.Contains(fa.AuthRequestHeaders, want) {
					t.Errorf("authRequestHeaders = %v, want %s among them", fa.AuthRequestHeaders, want)
				}
			}
			for _, want := range []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
				if !slices.Contains(fa.AuthResponseHeaders, want) {
					t.Errorf("authResponseHeaders = %v, want %s among them", fa.AuthResponseHeaders, want)
				}
			}
		}
		if forwardAuths == 0 {
			t.Errorf("router %s: no forwardAuth middleware, want the quotaflow one", name)
		}
	}
}
