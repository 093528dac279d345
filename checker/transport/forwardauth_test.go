package transport

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/quotaflow/quotaflow/checker"
)

// The IETF fields as draft-ietf-httpapi-ratelimit-headers-11 writes them: a list of
// structured-field items, each a String naming the policy with integer parameters.
var (
	rateLimitRE = regexp.MustCompile(`^"[\x20-\x21\x23-\x5b\x5d-\x7e]+";r=\d+;t=\d+$`)
	policyItem  = `"[\x20-\x21\x23-\x5b\x5d-\x7e]+";q=\d+;w=\d+(;burst=\d+)?`
	policyRE    = regexp.MustCompile(`^` + policyItem + `(, ` + policyItem + `)*$`)
)

func TestForwardAuthDenyStatus(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"", http.StatusTooManyRequests},
		{"?deny_status=429", http.StatusTooManyRequests},
		{"?deny_status=403", http.StatusForbidden},
		{"?deny_status=401", http.StatusUnauthorized},
	} {
		t.Run(tc.query, func(t *testing.T) {
			// user-tb allows 3 an hour: the fourth call is denied.
			headers := map[string]string{"X-User-Id": id(t, "u"), "X-Forwarded-Uri": "/tb"}
			for i := range 3 {
				resp, _ := getForwardAuth(t, env, headers, tc.query)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("call %d = %d, want 200", i+1, resp.StatusCode)
				}
			}
			resp, body := getForwardAuth(t, env, headers, tc.query)
			if resp.StatusCode != tc.want {
				t.Fatalf("fourth call = %d, want %d", resp.StatusCode, tc.want)
			}
			h := resp.Header
			for name, want := range map[string]string{
				"Retry-After": h.Get("Retry-After"), "X-RateLimit-Remaining": "0", "X-RateLimit-Limit": "3",
				"RateLimit-Policy": `"user-tb";q=3;w=3600`,
			} {
				if got := h.Get(name); got == "" || got != want {
					t.Errorf("%s = %q, want %q (non-empty)", name, got, want)
				}
			}
			if got := h.Get("RateLimit"); !regexp.MustCompile(`^"user-tb";r=0;t=\d+$`).MatchString(got) {
				t.Errorf("RateLimit = %q, want \"user-tb\";r=0;t=<seconds>", got)
			}
			if body["error"] != "rate_limit_exceeded" || body["allowed"] != false {
				t.Errorf("body = %v, want the rate_limit_exceeded answer", body)
			}
		})
	}
}

func TestForwardAuthDenyStatusInvalid(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, v := range []string{"200", "500", "x", "404"} {
		t.Run(v, func(t *testing.T) {
			resp, body := getForwardAuth(t, env, map[string]string{"X-User-Id": id(t, "u"), "X-Forwarded-Uri": "/tb"}, "?deny_status="+v)
			if resp.StatusCode != http.StatusBadRequest || body["error"] != "invalid_argument" {
				t.Errorf("deny_status=%s: got %d %v, want 400 invalid_argument", v, resp.StatusCode, body)
			}
		})
	}
}

// TestForwardAuthIETFFields checks the RateLimit and RateLimit-Policy syntax of every answer:
// allowed, allowed with several policies, denied.
func TestForwardAuthIETFFields(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	for _, tc := range []struct {
		name, endpoint string
		calls          int
		wantPolicy     string
	}{
		{"allowed", "/orders", 1, `"user-orders";q=5;w=3600`},
		{"two policies", "/multi", 1, `"user-multi-min";q=2;w=60, "user-multi-day";q=100;w=86400`},
		{"denied", "/swl", 4, `"user-swl";q=3;w=3600`},
		{"sub-second window", "/fast", 1, `"user-fast";q=2;w=1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := map[string]string{"X-User-Id": id(t, "u"), "X-Forwarded-Uri": tc.endpoint}
			var resp *http.Response
			for range tc.calls {
				resp, _ = getForwardAuth(t, env, headers, "")
			}
			if got := resp.Header.Get("RateLimit"); !rateLimitRE.MatchString(got) {
				t.Errorf("RateLimit = %q, want \"<policy>\";r=<remaining>;t=<seconds>", got)
			}
			got := resp.Header.Get("RateLimit-Policy")
			if !policyRE.MatchString(got) {
				t.Errorf("RateLimit-Policy = %q, want items \"<policy>\";q=<quota>;w=<seconds>", got)
			}
			if got != tc.wantPolicy {
				t.Errorf("RateLimit-Policy = %q, want %q", got, tc.wantPolicy)
			}
		})
	}
}

func TestForwardAuthProblem(t *testing.T) {
	t.Parallel()
	env := newEnv(t, checker.Config{})
	headers := map[string]string{"X-User-Id": id(t, "u"), "X-Forwarded-Uri": "/gcra", "Accept": "text/html, application/problem+json;q=0.9"}
	resp, body := getForwardAuth(t, env, headers, "")
	if got := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || got != "application/json" {
		t.Errorf("allowed answer = %d %s, want 200 application/json", resp.StatusCode, got)
	}
	if _, ok := body["type"]; ok {
		t.Errorf("allowed body = %v, want no problem members", body)
	}
	for range 3 {
		resp, body = getForwardAuth(t, env, headers, "")
	}
	if got := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusTooManyRequests || got != "application/problem+json" {
		t.Fatalf("denial = %d %s, want 429 application/problem+json", resp.StatusCode, got)
	}
	vp, _ := body["violated-policies"].([]any)
	if body["type"] != quotaExceededType || body["title"] != quotaExceededTitle || body["status"] != float64(429) ||
		len(vp) != 1 || vp[0] != "user-gcra" || body["error"] != "rate_limit_exceeded" {
		t.Errorf("problem = %v, want type quota-exceeded, status 429, violated-policies [user-gcra] and the plain members", body)
	}
	delete(headers, "Accept")
	resp, body = getForwardAuth(t, env, headers, "")
	if got := resp.Header.Get("Content-Type"); got != "application/json" || body["type"] != nil {
		t.Errorf("denial without Accept = %s %v, want application/json without problem members", got, body)
	}
}
