package console_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker/console"
)

// TestServes: the pages and their assets are in the binary, with the headers that keep them
// fresh and unframed; /console redirects to /console/.
func TestServes(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(console.Handler())
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tt := range []struct {
		path, contentType, contains string
	}{
		{"/console/", "text/html", `<script src="app.js">`},
		{"/console/app.js", "javascript", "function route()"},
		{"/console/app.css", "text/css", ".transitions"},
		{"/console/vendor/uPlot.iife.min.js", "javascript", "uPlot"},
		{"/console/vendor/uPlot.min.css", "text/css", ".uplot"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			resp, err := client.Get(srv.URL + tt.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), tt.contentType) || !strings.Contains(string(b), tt.contains) {
				t.Errorf("GET %s: %d %s, body has %q: %v; want 200 %s", tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), tt.contains,
					strings.Contains(string(b), tt.contains), tt.contentType)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("GET %s: Content-Security-Policy %q, want frame-ancestors 'none'", tt.path, csp)
			}
		})
	}
	resp, err := client.Get(srv.URL + "/console")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/console/" {
		t.Errorf("GET /console: %d to %q, want 301 to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// vendored maps each third-party file in static/vendor to where npm installs it from
// web/package-lock.json (make console copies them).
var vendored = map[string]string{
	"uPlot.iife.min.js": "uplot/dist/uPlot.iife.min.js",
	"uPlot.min.css":     "uplot/dist/uPlot.min.css",
	"uPlot.LICENSE":     "uplot/LICENSE",
}

// TestVendoredCurrent: the committed third-party files are those npm installs from the
// console's package-lock.json (make console copies them), so the build is reproducible and
// never edited by hand.
func TestVendoredCurrent(t *testing.T) {
	t.Parallel()
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm not found: install Node.js 20 and npm (the machine's own)")
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join("web", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
	for vendored, installed := range vendored {
		want, err := os.ReadFile(filepath.Join(dir, "node_modules", installed))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("static", "vendor", vendored))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("static/vendor/%s differs from npm's node_modules/%s: run make console and commit", vendored, installed)
		}
	}
}
