package client_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quotaflow/quotaflow/checker/client"
)

// TestMiddlewareCustomDimension: the middleware reads a custom dimension from its configured
// header, and the tenant's rule denies its third request whoever the user is; the client's
// Check names one with Custom.
func TestMiddlewareCustomDimension(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{
		User:             func(r *http.Request) string { return r.Header.Get("X-User") },
		DimensionHeaders: []client.DimensionHeader{{Dimension: "tenant", Header: "X-Tenant"}},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })))
	defer svc.Close()
	tenant := user(t, "{t}:")
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		req, _ := http.NewRequest(http.MethodGet, svc.URL+"/reports", nil)
		req.Header.Set("X-User", user(t, "u")+string(rune('a'+i)))
		req.Header.Set("X-Tenant", tenant)
		resp, err := svc.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("request %d (another user each time): %d, want %d", i, resp.StatusCode, want)
		}
	}
	d, err := c.Check(t.Context(), client.Request{Endpoint: "/reports", Subjects: []client.Subject{client.Custom("tenant", tenant)}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Error("Check of the tenant, past its limit: allowed, want denied")
	}
	if d.RuleID != "tenant-reports" || d.Remaining != 0 {
		t.Errorf("deciding rule %q remaining %d, want tenant-reports with 0", d.RuleID, d.Remaining)
	}
}
