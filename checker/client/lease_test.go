package client_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/quotaflow/quotaflow/checker/client"
)

// TestMiddlewareReleasesLeases: behind a concurrency rule of 2, the middleware lets two
// requests of a user in at once and answers the third 429 while they run; once they are served
// their places are released, so the next requests go in (with no wait for the lease's expiry,
// and no cached denial in between).
func TestMiddlewareReleasesLeases(t *testing.T) {
	t.Parallel()
	chk := newChecker(t)
	c := client.New(chk.url(), client.Config{Timeout: testTimeout})
	defer c.Close()
	inside, release := make(chan struct{}), make(chan struct{})
	svc := httptest.NewServer(c.Middleware(client.HTTPConfig{
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("wait") != "" {
			inside <- struct{}{}
			<-release
		}
		w.Write([]byte("ok"))
	})))
	defer svc.Close()
	u := user(t, "u")
	get := func(query string) int {
		req, _ := http.NewRequest(http.MethodGet, svc.URL+"/stream"+query, nil)
		req.Header.Set("X-User", u)
		resp, err := svc.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Go(func() { codes[i] = get("?wait=1") })
	}
	<-inside
	<-inside
	if code := get(""); code != http.StatusTooManyRequests {
		t.Errorf("a third request while two run: %d, want 429", code)
	}
	close(release)
	wg.Wait()
	if codes[0] != http.StatusOK || codes[1] != http.StatusOK {
		t.Errorf("the two running requests: %v, want 200s", codes)
	}
	for i := range 5 {
		if code := get(""); code != http.StatusOK {
			t.Errorf("request %d after the others were served: %d, want 200 (their places released)", i, code)
		}
	}
}
