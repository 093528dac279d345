package webhook_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/webhook"
)

// TestEndpointValidate: hostile or broken endpoints are refused with an error naming the
// field; the operator's allowed hosts and public addresses pass. Every URL is an IP or a name
// judged without DNS, so that the test needs no resolver.
func TestEndpointValidate(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	none := webhook.URLPolicy{}
	tests := []struct {
		name      string
		policy    webhook.URLPolicy
		mod       func(*webhook.Endpoint)
		wantField string // "" for valid
		wantMsg   string // a substring of the error
	}{
		{"public IPv4", none, withURL("https://93.184.215.14/hooks?x=1"), "", ""},
		{"public IPv6", none, withURL("http://[2606:4700::1111]:8443/h"), "", ""},
		{"loopback", none, withURL("http://127.0.0.1:8080/"), "url", "loopback"},
		{"loopback range", none, withURL("http://127.5.5.5/"), "url", "loopback"},
		{"IPv6 loopback", none, withURL("http://[::1]:9000/"), "url", "loopback"},
		{"IPv4-mapped loopback", none, withURL("http://[::ffff:127.0.0.1]/"), "url", "loopback"},
		{"NAT64 loopback", none, withURL("http://[64:ff9b::7f00:1]/"), "url", "loopback"},
		{"localhost", none, withURL("http://localhost:8080/"), "url", "loopback"},
		{"localhost subdomain", none, withURL("http://admin.LOCALHOST./"), "url", "loopback"},
		{"decimal IPv4", none, withURL("http://2130706433/"), "url", "four decimal numbers"},
		{"short IPv4", none, withURL("http://127.1/"), "url", "four decimal numbers"},
		{"hex IPv4", none, withURL("http://0x7f000001/"), "url", "four decimal numbers"},
		{"unspecified", none, withURL("http://0.0.0.0:8080/"), "url", "unspecified"},
		{"this network", none, withURL("http://0.1.2.3/"), "url", "unspecified"},
		{"private 10/8", none, withURL("http://10.1.2.3/"), "url", "private"},
		{"private 172.16/12", none, withURL("https://172.16.5.4/"), "url", "private"},
		{"private 192.168/16", none, withURL("https://192.168.1.1/"), "url", "private"},
		{"carrier-grade NAT", none, withURL("https://100.64.0.1/"), "url", "private"},
		{"unique local IPv6", none, withURL("https://[fd00::1]/"), "url", "private"},
		{"metadata service", none, withURL("http://169.254.169.254/latest/meta-data/"), "url", "link-local"},
		{"multicast", none, withURL("http://224.0.0.1/"), "url", "multicast"},
		{"broadcast", none, withURL("http://255.255.255.255/"), "url", "reserved"},
		{"private allowed", webhook.URLPolicy{AllowPrivate: true}, withURL("http://10.1.2.3/"), "", ""},
		{"private allowed, not loopback", webhook.URLPolicy{AllowPrivate: true}, withURL("http://127.0.0.1/"), "url", "loopback"},
		{"private allowed, not metadata", webhook.URLPolicy{AllowPrivate: true}, withURL("http://169.254.169.254/"), "url", "link-local"},
		{"allowed host:port", allowHosts("127.0.0.1:8080"), withURL("http://127.0.0.1:8080/h"), "", ""},
		{"allowed host:port, other port", allowHosts("127.0.0.1:8080"), withURL("http://127.0.0.1:9090/h"), "url", "loopback"},
		{"allowed name:port", allowHosts("localhost:8080"), withURL("http://LocalHost.:8080/h"), "", ""},
		{"allowed IPv6 host, any port", allowHosts("[::1]"), withURL("http://[::1]:1234/"), "", ""},
		{"allowed host, default port", allowHosts("10.0.0.1:443"), withURL("https://10.0.0.1/"), "", ""},
		{"user info", none, withURL("https://user:hunter2@93.184.215.14/"), "url", "user info"},
		{"ftp", none, withURL("ftp://93.184.215.14/"), "url", `scheme "ftp"`},
		{"javascript", none, withURL("javascript:alert(1)"), "url", `scheme "javascript"`},
		{"file", none, withURL("file:///etc/passwd"), "url", `scheme "file"`},
		{"relative", none, withURL("/hooks"), "url", `scheme ""`},
		{"no host", none, withURL("https:///hooks"), "url", "no host"},
		{"empty", none, withURL(""), "url", "required"},
		{"port 0", none, withURL("http://93.184.215.14:0/"), "url", "port"},
		{"port too big", none, withURL("http://93.184.215.14:70000/"), "url", "port"},
		{"IPv6 zone", allowHosts("fe80::1"), withURL("http://[fe80::1%25eth0]/"), "url", "zone"},
		{"not a URL", none, withURL("http://[::1/"), "url", "not a URL"},
		{"too long", none, withURL("https://93.184.215.14/" + strings.Repeat("a", 2048)), "url", "at most 2048 bytes"},
		{"no id", none, func(e *webhook.Endpoint) { e.ID = "" }, "id", "required"},
		{"id with a dot", none, func(e *webhook.Endpoint) { e.ID = "a.b" }, "id", "letters, digits"},
		{"id with a space", none, func(e *webhook.Endpoint) { e.ID = "a b" }, "id", "letters, digits"},
		{"id too long", none, func(e *webhook.Endpoint) { e.ID = strings.Repeat("a", 65) }, "id", "at most 64"},
		{"no secret", none, func(e *webhook.Endpoint) { e.Secret = webhook.Secret{} }, "secret", "required"},
		{"filter", none, func(e *webhook.Endpoint) { e.Filter = []string{"balance.low", "balance.out"} }, "", ""},
		{"empty type", none, func(e *webhook.Endpoint) { e.Filter = []string{"balance.low", ""} }, "filter[1]", "required"},
		{"type with a space", none, func(e *webhook.Endpoint) { e.Filter = []string{"balance low"} }, "filter[0]", "printable ASCII"},
		{"repeated type", none, func(e *webhook.Endpoint) { e.Filter = []string{"a", "b", "a"} }, "filter[2]", "repeats filter[0]"},
		{"too many types", none, func(e *webhook.Endpoint) { e.Filter = strings.Split(strings.Repeat("x,", 64)+"x", ",") }, "filter", "at most 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ep := webhook.Endpoint{ID: "billing-1", URL: "https://93.184.215.14/hooks", Secret: secret}
			tt.mod(&ep)
			err := ep.Validate(tt.policy)
			if tt.wantField == "" {
				if err != nil {
					t.Errorf("Validate(%q) = %v, want nil", ep.URL, err)
				}
				return
			}
			if got := fieldOf(err); got != tt.wantField || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate(%q) = %v (field %q), want an error naming %q, saying %q", ep.URL, err, got, tt.wantField, tt.wantMsg)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Validate error %q repeats the URL's password", err)
			}
		})
	}
}

// withURL sets an endpoint's URL.
func withURL(u string) func(*webhook.Endpoint) { return func(e *webhook.Endpoint) { e.URL = u } }

// allowHosts is a policy allowing hosts.
func allowHosts(hosts ...string) webhook.URLPolicy { return webhook.URLPolicy{AllowHosts: hosts} }

// TestClientRefusesAtDial: the connections themselves obey the policy, after DNS: a name that
// resolves to a loopback address (localhost, standing for a name rebound since its
// validation) is refused unless allowed, and the receiver never hears of it.
func TestClientRefusesAtDial(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	_, port, err := net.SplitHostPort(r.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		policy webhook.URLPolicy
		host   string
		want   int // the status; 0 for refused
	}{
		{"name resolving to loopback", webhook.URLPolicy{}, "localhost", 0},
		{"loopback address", webhook.URLPolicy{}, "127.0.0.1", 0},
		{"private allowed, still not loopback", webhook.URLPolicy{AllowPrivate: true}, "localhost", 0},
		{"allowed name, other port", allowHosts("localhost:1"), "localhost", 0},
		{"allowed name:port", allowHosts("localhost:" + port), "localhost", http.StatusOK},
		{"allowed name, any port", allowHosts("localhost"), "localhost", http.StatusOK},
		{"allowed address:port", allowHosts("127.0.0.1:" + port), "127.0.0.1", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ep := webhook.Endpoint{ID: "e", URL: "http://" + tt.host + ":" + port + "/h", Secret: r.secret}
			id := "msg-" + strings.ReplaceAll(tt.name, " ", "-")
			a := webhook.NewSender(tt.policy, 5*time.Second).Send(context.Background(), ep, webhook.Message{ID: id, Body: []byte(`{}`)})
			if a.Status != tt.want {
				t.Fatalf("Send to %s = status %d, err %q; want %d", ep.URL, a.Status, a.Err, tt.want)
			}
			if tt.want == 0 && (!contains(a.Err, "refused by the webhook URL policy", "loopback") || !a.Retry) {
				t.Errorf("Send to %s: err %q, retry %v; want the policy's refusal, retried", ep.URL, a.Err, a.Retry)
			}
			for _, d := range r.deliveries() {
				if d.id == id && tt.want == 0 {
					t.Errorf("receiver got %s, which the policy refused", id)
				}
			}
		})
	}
}

// TestErrRefusedAddress: the refusal is recognisable in the client's error.
func TestErrRefusedAddress(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	_, err := webhook.URLPolicy{}.Client().Post(r.srv.URL, "application/json", strings.NewReader("{}"))
	if !errors.Is(err, webhook.ErrRefusedAddress) {
		t.Errorf("Post to %s = %v, want ErrRefusedAddress", r.srv.URL, err)
	}
}
