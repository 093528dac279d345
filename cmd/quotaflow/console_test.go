package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const consoleRules = `
default_tier: free
tiers: {free: {description: the free plan}}
warnings: {enter: 0.6, exit: 0.5}
rules:
  - {id: console-api, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 5, window: 1h}
`

// browser starts Debian's chromium headless, as this machine allows it (no sandbox as root,
// no background networking, which the closed network refuses), with a viewport of w×h.
func browser(t *testing.T, w, h int) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not found: deploy/dev/install-deps.sh installs Debian's chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(w, h))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// within runs actions with a deadline, failing the test with what was being waited for.
func within(t *testing.T, ctx context.Context, d time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx0 := ctx
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		page, _ := chromedp.Run(ctx0, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 2000)`))
		t.Fatalf("%s: %v; page:\n%s", what, err, page)
	}
}

// pageTrue is the condition that a JavaScript expression in the page is true; while it is not,
// its error shows the page.
func pageTrue(ctx context.Context, expr string) func() error {
	return func() error {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && ok {
			return nil
		}
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`))
		return fmt.Errorf("%s still false (%v); page:\n%s", expr, err, text)
	}
}

// consolePipeline runs a checker with the console's rules and tokens on its own NATS, and an
// aggregator storing into a database of its own, which it returns.
func consolePipeline(t *testing.T, name string, tokens map[string]admin.Token, opts ...func(*daemon.CheckerConfig)) (*natstest.Server, string, *checkerProc) {
	t.Helper()
	ns := ownNATS(t)
	db := databaseName(name)
	p := startChecker(t, name, ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile, c.Redis = writeFile(t, "rules.yaml", consoleRules), redisDB(t, 13)
		c.AuditClickHouseDSN = chSrv.DSN(db)
		c.Admin.Tokens = tokens
		for _, o := range opts {
			o(c)
		}
	})
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond, WarningGrace: 100 * time.Millisecond, InsertTimeout: 5 * time.Second}})
	return ns, db, p
}

// TestConsole drives the web console in a real browser against a real pipeline (checker,
// NATS, aggregator, ClickHouse, Redis): the page loads, a user the test throttles shows up as
// a live transition, an override made through the console's form changes the next check's
// limit, the usage chart and the subject view show the test's checks, and the page fits a
// phone. It measures the page's weight and time to first render.
func TestConsole(t *testing.T) {
	t.Parallel()
	ns, db, p := consolePipeline(t, "console", map[string]admin.Token{"console-write": {Name: "operator", Role: admin.RoleWrite}})
	user := "console-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	check := func() *quotaflowv1.CheckRateLimitResponse {
		t.Helper()
		resp, err := p.client.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/api/items",
			Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}

	ctx := browser(t, 1280, 900)
	began := time.Now()
	within(t, ctx, 30*time.Second, "load the console and sign in",
		chromedp.Navigate(p.url+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), "console-write"),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#app")))
	poll.Until(t, 20*time.Second, "the live feed connects", pageTrue(ctx, `document.querySelector("#live-status").textContent.startsWith("Live")`))
	poll.Until(t, 20*time.Second, "the processes' own reports", pageTrue(ctx, `!!document.querySelector('#processes tr[data-role="checker"][data-instance^="console-"]') && !!document.querySelector('#processes tr[data-role="aggregator"]') &&
		document.querySelector('#processes tr[data-role="checker"]').innerText.includes("redis ok")`))
	t.Logf("console loaded and signed in in %s", time.Since(began).Round(time.Millisecond))
	type pageWeight struct {
		Transfer, Decoded float64
		Resources         int
		FCP               float64
	}
	weight, err := chromedp.Run(ctx, chromedp.Evaluate[pageWeight](`(() => {
		const own = performance.getEntriesByType("resource").filter((e) => e.name.includes("/console/"));
		const nav = performance.getEntriesByType("navigation")[0];
		const fcp = performance.getEntriesByType("paint").find((e) => e.name === "first-contentful-paint");
		return {Transfer: nav.transferSize + own.reduce((s, e) => s + e.transferSize, 0),
			Decoded: nav.decodedBodySize + own.reduce((s, e) => s + e.decodedBodySize, 0),
			Resources: own.length + 1, FCP: fcp ? fcp.startTime : -1};
	})()`))
	if err != nil {
		t.Fatalf("measure the page: %v", err)
	}
	t.Logf("page weight: %d requests, %.1f kB transferred, %.1f kB decoded; first contentful paint %.0f ms",
		weight.Resources, weight.Transfer/1024, weight.Decoded/1024, weight.FCP)
	if weight.Resources != 5 || weight.FCP <= 0 {
		t.Errorf("page: %d requests, first contentful paint %.0f ms; want the page and its 4 assets, a paint", weight.Resources, weight.FCP)
	}

	// Throttle the user: 5 allowed, then denied; the aggregator's transition reaches the page.
	for i := range 8 {
		if got := check(); got.Allowed != (i < 5) {
			t.Fatalf("check %d of %s: allowed %v, want %v", i+1, user, got.Allowed, i < 5)
		}
	}
	poll.Until(t, 30*time.Second, "a live throttled transition", pageTrue(ctx, fmt.Sprintf(`!!document.querySelector('#live-list li[data-to="throttled"][data-subject="user:%s"]')`, user)))
	stop := make(chan struct{})
	go func() { // checks/s: a denied check every 50 ms while the page counts them
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				check()
			}
		}
	}()
	poll.Until(t, 10*time.Second, "the denied checks/s counter", pageTrue(ctx, `Number(document.querySelector("#rate-denied").textContent) > 0`))
	close(stop)

	// An override made through the console's form: the next check meets a limit of 50.
	within(t, ctx, 20*time.Second, "create an override in the console",
		chromedp.Navigate(p.url+"/console/#overrides"),
		chromedp.WaitVisible(chromedp.CSS("#override-form")),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="dimension"]`), "user"),
		chromedp.SendKeys(chromedp.CSS(`#override-form [name="identifier"]`), user),
		chromedp.SendKeys(chromedp.CSS(`#override-form [name="rule_id"]`), "console-api"),
		chromedp.SendKeys(chromedp.CSS(`#override-form [name="limit"]`), "50"),
		chromedp.SendKeys(chromedp.CSS(`#override-form [name="duration"]`), "1h"),
		chromedp.SendKeys(chromedp.CSS(`#override-form [name="reason"]`), "console test"),
		chromedp.Click(chromedp.CSS(`#override-form button[type="submit"]`)))
	poll.Until(t, 10*time.Second, "the override listed", pageTrue(ctx, fmt.Sprintf(`[...document.querySelectorAll("#overrides tbody tr")].some((r) => r.innerText.includes("user:%s"))`, user)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := check()
		if got.Allowed && got.Limit == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("check after the console's override: allowed %v, limit %d; want allowed, limit 50", got.Allowed, got.Limit)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The usage chart and its totals show the test's checks; the subject view its limits.
	within(t, ctx, 20*time.Second, "open usage", chromedp.Navigate(p.url+"/console/#usage"), chromedp.WaitVisible(chromedp.CSS("#usage-chart")))
	deadline = time.Now().Add(30 * time.Second)
	for {
		checks, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`(() => { const r = document.querySelector('#usage-totals tr[data-key="free"]'); return r ? Number(r.dataset.checks) : 0 })()`))
		canvas, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector("#usage-chart canvas")`))
		if checks >= 9 && canvas {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage: tier free shows %d checks, chart drawn %v; want at least 9 and a chart", checks, canvas)
		}
		_ = chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#usage-form button[type="submit"]`)))
		time.Sleep(300 * time.Millisecond)
	}
	if path := os.Getenv("QUOTAFLOW_CONSOLE_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	within(t, ctx, 20*time.Second, "open the subject view", chromedp.Navigate(p.url+"/console/#subject/user:"+user),
		chromedp.WaitVisible(chromedp.CSS(`#subject-limits tr[data-rule="console-api"][data-limit="50"]`)))
	poll.Until(t, 20*time.Second, "the subject's recent decisions", pageTrue(ctx, `document.querySelectorAll("#subject-decisions tbody tr").length >= 9`))

	// On a phone-sized screen nothing runs off the side.
	within(t, ctx, 10*time.Second, "phone-sized", chromedp.EmulateViewport(390, 844), chromedp.Navigate(p.url+"/console/#live"),
		chromedp.WaitVisible(chromedp.CSS(".rates")))
	poll.Until(t, 5*time.Second, "no horizontal scroll at 390 px", pageTrue(ctx, `document.documentElement.scrollWidth <= window.innerWidth`))

	// A checker whose ClickHouse is unreachable: a banner says so, and the live feed works.
	blind := startChecker(t, "console-blind", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile, c.Redis = writeFile(t, "rules.yaml", consoleRules), redisDB(t, 13)
		c.AuditClickHouseDSN = "clickhouse://127.0.0.1:1/" + db
		c.Admin.Tokens = map[string]admin.Token{"console-read": {Name: "analyst", Role: admin.RoleRead}}
	})
	within(t, ctx, 30*time.Second, "sign in to the checker without ClickHouse",
		chromedp.Navigate(blind.url+"/console/"), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), "console-read"), chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS("#app")))
	poll.Until(t, 20*time.Second, "the ClickHouse banner", pageTrue(ctx, `!!document.querySelector('#banners [data-part="clickhouse"]')`))
	req, _ := http.NewRequest("GET", blind.url+"/api/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer console-read")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(b), "usage series") {
			t.Errorf("usage without ClickHouse: %d %s; want 503 saying what failed", resp.StatusCode, b)
		}
	}
	poll.Until(t, 20*time.Second, "the live feed without ClickHouse", pageTrue(ctx, `document.querySelector("#live-status").textContent.startsWith("Live")`))

	// NATS down: a banner says so, and the usage view still answers from ClickHouse.
	within(t, ctx, 20*time.Second, "back to the first checker", chromedp.Navigate(p.url+"/console/#live"), chromedp.WaitVisible(chromedp.CSS("#app")))
	ns.Close()
	poll.Until(t, 20*time.Second, "the NATS banner", pageTrue(ctx, `!!document.querySelector('#banners [data-part="nats"]')`))
	within(t, ctx, 20*time.Second, "usage without NATS", chromedp.Navigate(p.url+"/console/#usage"),
		chromedp.WaitVisible(chromedp.CSS(`#usage-totals tr[data-key="free"]`)))
	if strings.Contains(p.log.String(), "panic") {
		t.Errorf("the checker logged a panic:\n%s", p.log)
	}
}

// TestConsoleAPI: the admin API's reads behind the console answer what they promise, CSV for a
// billing period, and a 400 naming the field for each bad parameter.
func TestConsoleAPI(t *testing.T) {
	t.Parallel()
	_, db, p := consolePipeline(t, "consoleapi", map[string]admin.Token{"api-read": {Name: "analyst", Role: admin.RoleRead}},
		func(c *daemon.CheckerConfig) { c.Admin.MaxLiveFeeds = 1 })
	user := "api-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for range 7 {
		if _, err := p.client.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/api/items",
			Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}})); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := poll.Wait(ctx, "the audit's decisions", decisionsStored(t, db, 7)); err != nil {
		t.Fatal(err)
	}
	get := func(path, token string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/api/v1"+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	month := time.Now().In(time.FixedZone("", 0)).Format("2006-01")
	code, typ, body := get("/subjects/user:"+user+"/billing?format=csv&tz=UTC", "api-read")
	if code != 200 || !strings.HasPrefix(typ, "text/csv") || !strings.Contains(body, fmt.Sprintf("user:%s,UTC,total %s,7,5,5,2,0,0,0", user, month)) {
		t.Errorf("billing as CSV: %d %s\n%s\nwant 7 checks, 5 allowed costing 5, 2 denied", code, typ, body)
	}
	if code, _, body := get("/subjects/user:"+user+"/limits?endpoint=/api/items", "api-read"); code != 200 ||
		!strings.Contains(body, `"rule_id":"console-api"`) || !strings.Contains(body, `"remaining":0`) {
		t.Errorf("a subject's limits: %d %s; want console-api with nothing left", code, body)
	}
	if code, _, body := get("/subjects/user:"+user+"/decisions?n=3", "api-read"); code != 200 || strings.Count(body, `"endpoint":"/api/items"`) != 3 {
		t.Errorf("a subject's 3 latest decisions: %d %s", code, body)
	}
	if code, _, body := get("/health", "api-read"); code != 200 || !strings.Contains(body, `"clickhouse":{"ok":true`) {
		t.Errorf("health: %d %s; want ClickHouse ok", code, body)
	}
	for _, tt := range []struct{ path, field string }{
		{"/usage?span=soon", "span"},
		{"/usage?by=endpoint", "by"},
		{"/usage?span=400d", "span"},
		{"/usage/top?n=1000", "n"},
		{"/usage/top?n=x", "n"},
		{"/subjects/alice/decisions", "subject"},
		{"/subjects/user:a/billing?tz=Mars/Olympus", "tz"},
		{"/subjects/user:a/billing?month=11-2026", "month"},
		{"/subjects/user:a/billing?format=xml", "format"},
		{"/subjects/org:acme/limits", "subject"},
		{"/subjects/user:a/limits?endpoint=no-leading-slash", "endpoint"},
		{"/subjects/user:" + strings.Repeat("x", 2000) + "/limits", "subject"},
		{"/subjects/user:" + strings.Repeat("x", 2000) + "/billing", "subject"},
	} {
		var e admin.Error
		if code, _, body := get(tt.path, "api-read"); code != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Field != tt.field {
			t.Errorf("GET %s: %d %s; want 400 naming %s", tt.path, code, body, tt.field)
		}
	}
	if code, _, _ := get("/live", ""); code != 401 {
		t.Errorf("GET /live without a token: %d, want 401", code)
	}
	// One live feed at most on this checker: a second waits for the first to close.
	req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/api/v1/live", nil)
	req.Header.Set("Authorization", "Bearer api-read")
	feed, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if first, _ := bufio.NewReader(feed.Body).ReadString('\n'); feed.StatusCode != 200 || first != "event: hello\n" {
		t.Errorf("GET /live: %d, first line %q; want 200 and the hello event", feed.StatusCode, first)
	}
	if code, _, body := get("/live", "api-read"); code != 503 || !strings.Contains(body, "serves 1 live feeds already") {
		t.Errorf("a second live feed: %d %s; want 503", code, body)
	}
	feed.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/api/v1/live", nil)
		req.Header.Set("Authorization", "Bearer api-read")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a live feed after the first closed: %d, want 200", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// consoleOverflows lists the boxes of the visible view whose table is wider than the box (it
// scrolls sideways), as "table id: scroll width > width".
const consoleOverflows = `[...document.querySelectorAll(".view:not([hidden]) .scroll")]
	.filter((b) => b.offsetParent !== null && b.scrollWidth > b.clientWidth)
	.map((b) => b.firstElementChild.id + ": " + b.scrollWidth + " > " + b.clientWidth)`

// consoleCells lists the text of the cells of the rows that match selector, row by row.
func consoleCells(t *testing.T, ctx context.Context, selector string) [][]string {
	t.Helper()
	cells, err := chromedp.Run(ctx, chromedp.Evaluate[[][]string](fmt.Sprintf(`[...document.querySelectorAll(%q)]
		.map((tr) => [...tr.children].map((td) => td.innerText.trim()))`, selector)))
	if err != nil {
		t.Fatalf("read %s: %v", selector, err)
	}
	return cells
}

// consoleBadCells lists the visible view's cells (the chart's legend's too) that show nothing or
// dashes (an absent value must read "—" or "none"), a number of four digits or more without
// thousands separators, or a window as Go writes durations (1m0s, 24h0m0s).
const consoleBadCells = `[...document.querySelectorAll(".view:not([hidden]) td")].filter((td) => td.offsetParent !== null)
	.map((td) => [td.closest("table").id, td.innerText.trim(), td])
	.filter(([, text, td]) => (!text && !td.querySelector("button")) || /^-{2,}/.test(text) || (td.classList.contains("num") && /\d{4}/.test(text)) || /\d+[hm]0s\b|\dh0m\b/.test(text))
	.map(([table, text]) => (table || "chart") + ": " + JSON.stringify(text))`

// TestConsoleViews drives the console over the rules of make dev (deploy/dev/rules.yaml): the
// live counters and the checker's row show one measure of known traffic; every limit of a
// user's Subject view has used, remaining and state; windows read as people write them (1m,
// 24h) and numbers with thousands separators; an absent value reads "—" or "none"; no table is
// wider than its box at 1,400 px (the Rules view's edge.* ids once hid its last columns); and
// on a phone the Subject view shows rule, used, remaining and state first.
func TestConsoleViews(t *testing.T) {
	t.Parallel()
	const token = "views-write"
	_, _, p := consolePipeline(t, "consoleviews", map[string]admin.Token{token: {Name: "operator", Role: admin.RoleWrite}},
		func(c *daemon.CheckerConfig) { c.RulesFile = "../../deploy/dev/rules.yaml" })
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	check := func(user, endpoint string) {
		if _, err := p.client.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: endpoint,
			Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}})); err != nil {
			t.Errorf("check of user %s at %s: %v", user, endpoint, err)
		}
	}

	ctx := browser(t, 1400, 900)
	shot := func(name string) { // QUOTAFLOW_CONSOLE_SHOTS=dir: each step's page as a PNG, to look at
		if dir := os.Getenv("QUOTAFLOW_CONSOLE_SHOTS"); dir != "" {
			if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
			}
		}
	}
	within(t, ctx, 30*time.Second, "load the console and sign in",
		chromedp.Navigate(p.url+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#app")))
	poll.Until(t, 20*time.Second, "the live feed and the checker's row", pageTrue(ctx, `document.querySelector("#live-status").textContent.startsWith("Live") &&
		!!document.querySelector('#processes tr[data-role="checker"] td.checks')`))

	// Known traffic, 25 checks a second that no rule limits: the counters and the checker's row
	// show it, and agree whenever they are read; then both fall to 0.
	type rates struct {
		Counters []int // allowed, delayed, denied, fail mode
		Row      int   // the checker's checks/s
	}
	read := func() rates {
		t.Helper()
		r, err := chromedp.Run(ctx, chromedp.Evaluate[rates](`(() => {
			const n = (s) => Number(document.querySelector(s).textContent.replace(/,/g, ""));
			const row = document.querySelector('#processes tr[data-role="checker"] td.checks');
			return {Counters: ["allowed", "delayed", "denied", "degraded"].map((k) => n("#rate-" + k)), Row: row ? Number(row.dataset.checks) : -1};
		})()`))
		if err != nil {
			t.Fatalf("read the rates: %v", err)
		}
		return r
	}
	sum := func(r rates) int { return r.Counters[0] + r.Counters[1] + r.Counters[2] + r.Counters[3] }
	stop := make(chan struct{})
	sent := make(chan int)
	go func() { // an open loop: a check every 40 ms however long each takes on a loaded machine
		var wg sync.WaitGroup
		n := 0
		tick := time.NewTicker(40 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				wg.Wait()
				sent <- n
				return
			case <-tick.C:
				wg.Go(func() { check("rate-"+suffix, "/static/page") })
				n++
			}
		}
	}()
	began := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	var got rates
	for agreed := 0; agreed < 5; time.Sleep(500 * time.Millisecond) {
		got = read()
		switch {
		case sum(got) != got.Row:
			t.Errorf("live counters %v (%d checks/s) beside the checker's row %d checks/s: want one measure", got.Counters, sum(got), got.Row)
			agreed = 0
		case got.Counters[0] >= 10 && got.Counters[0] <= 40 && sum(got) == got.Counters[0]:
			agreed++ // the traffic's rate, all allowed, read the same in both places
		}
		if time.Now().After(deadline) {
			t.Fatalf("live counters %v, the checker's row %d checks/s; want about 25 allowed/s in both", got.Counters, got.Row)
		}
	}
	close(stop)
	t.Logf("25 checks/s for %s (%d sent): counters %v, the checker's row %d checks/s", time.Since(began).Round(time.Second), <-sent, got.Counters, got.Row)
	poll.Until(t, 20*time.Second, "both at 0 once the traffic stops", func() error {
		if r := read(); sum(r) != 0 || r.Row != 0 {
			return fmt.Errorf("counters %v, the checker's row %d", r.Counters, r.Row)
		}
		return nil
	})

	// An empty overrides table says so.
	within(t, ctx, 20*time.Second, "the empty overrides", chromedp.Navigate(p.url+"/console/#overrides"),
		chromedp.WaitVisible(chromedp.CSS("#overrides tbody tr.none")))
	if got := consoleCells(t, ctx, "#overrides tbody tr"); len(got) != 1 || len(got[0]) != 1 || got[0][0] != "none" {
		t.Errorf("the overrides without any: %q, want one row saying none", got)
	}
	// One override with a long target and reason, for the table's width.
	long := "a-customer-whose-identifier-is-long-" + suffix
	body := fmt.Sprintf(`{"dimension":"user","identifier":%q,"rule_id":"user-api-day","limit":25000,"duration":"1h","reason":"a contract of 25,000 checks a day, signed for the launch of their new mobile application, until the renegotiation"}`, long)
	req, _ := http.NewRequest("POST", p.url+"/api/v1/overrides", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create an override: %d, want 201", resp.StatusCode)
	}

	// A user's limits: 10 checks of /api/items (user-api-minute: 10 a minute; user-api-day:
	// 1,000 a day).
	user := "views-" + suffix
	for range 10 {
		check(user, "/api/items")
	}
	subjectRows := `#subject-limits tbody tr[data-rule]`
	within(t, ctx, 20*time.Second, "a user's subject view", chromedp.Navigate(p.url+"/console/#subject/user:"+user),
		chromedp.WaitVisible(chromedp.CSS(`#subject-limits tr[data-rule="user-api-day"]`)))
	poll.Until(t, 20*time.Second, "the subject's overrides and billing", pageTrue(ctx, `!!document.querySelector("#subject-overrides li") &&
		!!document.querySelector('#subject-billing tbody tr[data-day^="total"]')`))
	heads := consoleCells(t, ctx, "#subject-limits thead tr")
	byRule := map[string]map[string]string{}
	for _, row := range consoleCells(t, ctx, subjectRows) {
		cells := map[string]string{}
		for i, h := range heads[0] {
			if i < len(row) {
				cells[h] = row[i]
			}
		}
		byRule[cells["rule"]] = cells
		if s := cells["state"]; cells["used"] == "" || cells["used"] == "—" || cells["remaining"] == "" || cells["remaining"] == "—" ||
			(s != "normal" && s != "warning" && s != "throttled") {
			t.Errorf("user %s, rule %s: used %q, remaining %q, state %q; want numbers and normal, warning or throttled", user, cells["rule"], cells["used"], cells["remaining"], s)
		}
	}
	for _, tt := range []struct {
		rule, limit, used, remaining, state string // state "": any (a token bucket refills)
	}{
		{"user-api-minute", "10 / 1m", "", "", ""},
		{"user-api-day", "1,000 / 24h", "10", "990", "normal"},
		{"user-search", "5 / 10s", "0", "5", "normal"},
	} {
		got, ok := byRule[tt.rule]
		switch {
		case !ok:
			t.Errorf("user %s: no row of %s in %v", user, tt.rule, byRule)
		case got["limit"] != tt.limit || tt.used != "" && (got["used"] != tt.used || got["remaining"] != tt.remaining) || tt.state != "" && got["state"] != tt.state:
			t.Errorf("user %s, rule %s: limit %q, used %q, remaining %q, state %q; want %q, %q, %q, %q",
				user, tt.rule, got["limit"], got["used"], got["remaining"], got["state"], tt.limit, tt.used, tt.remaining, tt.state)
		}
	}
	// An empty billing month is this month: the field says so, not the browser's "--------- ----"
	// of an empty month field.
	type field struct{ Type, Value, Placeholder string }
	month, err := chromedp.Run(ctx, chromedp.Evaluate[field](`(() => {
		const m = document.querySelector('#billing-form [name="month"]');
		return {Type: m.type, Value: m.value, Placeholder: m.placeholder};
	})()`))
	if err != nil || month.Value == "" && (month.Type == "month" || !strings.Contains(month.Placeholder, "this month")) {
		t.Errorf("the billing month field: %+v (%v); want a value, or a placeholder saying this month", month, err)
	}
	shot("subject-1400")

	// At 1,400 px no table is wider than its box, and no cell is blank, a number without
	// separators or a Go duration, in any view.
	for _, view := range []string{"#live", "#subject/user:" + user, "#overrides", "#rules", "#usage"} {
		within(t, ctx, 20*time.Second, "open "+view, chromedp.Navigate(p.url+"/console/"+view),
			chromedp.WaitVisible(chromedp.CSS(".view:not([hidden]) table tbody tr")))
		time.Sleep(time.Second) // the view's reads
		shot(strings.NewReplacer("#", "", "/", "-", ":", "-").Replace(view) + "-1400")
		if over, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](consoleOverflows)); err != nil || len(over) > 0 {
			t.Errorf("%s at 1,400 px: tables wider than their box: %q (%v)", view, over, err)
		}
		if bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](consoleBadCells)); err != nil || len(bad) > 0 {
			t.Errorf("%s: cells blank, with a number without separators or a Go duration: %q (%v)", view, bad, err)
		}
	}
	// The Rules view: the longest ids are wrapped, whole in their title; limits and windows as
	// everywhere.
	id := "edge.source_cluster_proxy.destination_cluster_payments"
	title, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector('#rules tr[data-rule=%q] td [title]').title`, id)))
	if err != nil || title != id {
		t.Errorf("the rule %s's id cell: title %q (%v), want the whole id", id, title, err)
	}
	rules := map[string][]string{}
	for _, row := range consoleCells(t, ctx, "#rules tbody tr") {
		rules[row[0]] = row
	}
	for rule, want := range map[string][2]string{"user-api-day": {"1,000", "24h"}, "apikey-hour": {"3,600", "1h"}, "premium-api-day": {"50,000", "24h"}, "user-search": {"5", "10s"}} {
		if got := rules[rule]; len(got) < 7 || got[5] != want[0] || got[6] != want[1] {
			t.Errorf("rules view, %s: %q; want limit %s, window %s", rule, got, want[0], want[1])
		}
	}

	// On a phone the Subject view shows rule, used, remaining and state first, within the
	// screen; endpoint, algorithm and overrides are hidden.
	within(t, ctx, 20*time.Second, "the subject view on a phone", chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(p.url+"/console/#subject/user:"+user), chromedp.WaitVisible(chromedp.CSS(`#subject-limits tr[data-rule="user-api-day"]`)))
	shot("subject-390")
	type column struct {
		Name    string
		Visible bool // displayed, and within the table's box without scrolling
	}
	cols, err := chromedp.Run(ctx, chromedp.Evaluate[[]column](`(() => {
		const box = document.querySelector("#subject-limits").parentElement.getBoundingClientRect();
		return [...document.querySelectorAll("#subject-limits thead th")].map((th) => {
			const r = th.getBoundingClientRect();
			return {Name: th.innerText.trim(), Visible: th.offsetParent !== null && r.width > 0 && r.left >= box.left && r.right <= box.right + 0.5};
		});
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, c := range cols {
		if c.Visible {
			shown = append(shown, c.Name)
		}
	}
	if len(shown) < 4 || strings.Join(shown[:4], ",") != "rule,used,remaining,state" || slices.Contains(shown, "endpoint") || slices.Contains(shown, "algorithm") {
		t.Errorf("the subject's limits at 390 px show %q; want rule, used, remaining and state first, not endpoint nor algorithm", shown)
	}
	poll.Until(t, 5*time.Second, "no horizontal scroll at 390 px", pageTrue(ctx, `document.documentElement.scrollWidth <= window.innerWidth`))
	if strings.Contains(p.log.String(), "panic") {
		t.Errorf("the checker logged a panic:\n%s", p.log)
	}
}

// balanceRules are the console's rules with two entitlements: llm-tokens held per user and
// burned by checks of /v1/chat, and key-calls held per API key, which a user's view must not
// show.
const balanceRules = consoleRules + `entitlements:
  - {id: llm-tokens, dimension: user, endpoints: [/v1/chat], period: 1mo}
  - {id: key-calls, dimension: apikey, period: 1d}
`

// TestConsoleBalances drives the Subject view's balances and the Webhooks view in a real
// browser against a real pipeline: a user's view shows the entitlements held per user only; a
// grant made through its form (after a refusal the API explains beside the form) is listed
// with what it has left, burned by a check, voided with its button; the Webhooks view says
// none, then lists an endpoint set through the admin API and its empty delivery log; on a
// phone a grant's left, amount and state stay in sight. A checker without ClickHouse shows the
// delivery log's 503 message, and a read token's grant the API's refusal. Attempts written into
// the delivery log show as rows, the newest first, each field rendered.
func TestConsoleBalances(t *testing.T) {
	t.Parallel()
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36) // Redis keeps balances and tokens' buckets across runs
	token, readToken := "balances-write-"+suffix, "balances-read-"+suffix
	ns, db, p := consolePipeline(t, "consolebalances", map[string]admin.Token{token: {Name: "operator", Role: admin.RoleWrite}},
		func(c *daemon.CheckerConfig) {
			c.RulesFile = writeFile(t, "rules.yaml", balanceRules)
			c.Admin.WebhookPolicy.AllowHosts = []string{"hooks.example.com"}
		})
	user := "balances-" + suffix
	apiCall := func(url, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+"/api/v1"+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	balance := func() admin.BalanceView {
		t.Helper()
		code, body := apiCall(p.url, "GET", "/grants?entitlement=llm-tokens&subject="+user, "")
		var b admin.BalanceView
		if err := json.Unmarshal([]byte(body), &b); code != 200 || err != nil {
			t.Fatalf("GET /grants: %d %s (%v)", code, body, err)
		}
		return b
	}

	ctx := browser(t, 1280, 900)
	shot := func(name string) { // QUOTAFLOW_CONSOLE_SHOTS=dir: each step's page as a PNG, to look at
		if dir := os.Getenv("QUOTAFLOW_CONSOLE_SHOTS"); dir != "" {
			if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
			}
		}
	}
	within(t, ctx, 30*time.Second, "load the console and sign in",
		chromedp.Navigate(p.url+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#app")))

	// Webhooks: none, then the endpoint set through the API, with its empty delivery log.
	within(t, ctx, 20*time.Second, "the webhooks without any", chromedp.Navigate(p.url+"/console/#webhooks"),
		chromedp.WaitVisible(chromedp.CSS("#webhooks tbody tr.none")))
	if got := consoleCells(t, ctx, "#webhooks tbody tr"); len(got) != 1 || len(got[0]) != 1 || got[0][0] != "none" {
		t.Errorf("the webhooks without any: %q, want one row saying none", got)
	}
	code, body := apiCall(p.url, "PUT", "/webhooks/billing", `{"url":"https://hooks.example.com/x","filter":["entitlement.used_percent","entitlement.balance_below"]}`)
	var ep admin.EndpointView
	if err := json.Unmarshal([]byte(body), &ep); code != 201 || err != nil || ep.SecretHint == "" {
		t.Fatalf("PUT /webhooks/billing: %d %s (%v); want 201 and a secret hint", code, body, err)
	}
	within(t, ctx, 20*time.Second, "the webhook endpoint listed", chromedp.Navigate(p.url+"/console/#live"), chromedp.Navigate(p.url+"/console/#webhooks"),
		chromedp.WaitVisible(chromedp.CSS(`#webhooks tr[data-id="billing"]`)))
	want := []string{"billing", "https://hooks.example.com/x", "entitlement.used_percent, entitlement.balance_below", "enabled", ep.SecretHint, "deliveries"}
	if got := consoleCells(t, ctx, "#webhooks tbody tr"); len(got) != 1 || strings.Join(got[0], "|") != strings.Join(want, "|") {
		t.Errorf("the webhooks: %q, want one row %q", got, want)
	}
	if hidden, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#deliveries-box").hidden`)); !hidden {
		t.Errorf("the delivery log shown before an endpoint is chosen")
	}
	within(t, ctx, 20*time.Second, "the endpoint's deliveries", chromedp.Click(chromedp.CSS(`#webhooks tr[data-id="billing"] a`)),
		chromedp.WaitVisible(chromedp.CSS("#deliveries tbody tr.none")))
	if got, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash + " " + document.querySelector("#deliveries-of").textContent`)); got != "#webhooks/billing of billing" {
		t.Errorf("the chosen endpoint: %q, want #webhooks/billing of billing", got)
	}
	shot("webhooks-1280")

	// The delivery log with attempts in it (as the aggregators log them; the webhook tests
	// make real ones): the newest first, each outcome, status, attempt, duration, wait and error
	// rendered, absent ones as "—", another endpoint's left out.
	logDeliveries(t, db, []deliveryRow{
		{-3 * time.Second, "billing", 1, 0, "retry", "dial tcp: connection refused", 1500, 2000},
		{-2 * time.Second, "billing", 2, 503, "retry", "HTTP 503", 40, 4000},
		{-time.Second, "billing", 3, 200, "delivered", "", 12, 0},
		{-time.Second, "crm", 1, 200, "delivered", "", 12, 0},
	})
	within(t, ctx, 20*time.Second, "the endpoint's deliveries, logged", chromedp.Navigate(p.url+"/console/#live"),
		chromedp.Navigate(p.url+"/console/#webhooks/billing"), chromedp.WaitVisible(chromedp.CSS(`#deliveries tbody tr[data-outcome="delivered"]`)))
	wantLog := [][]string{ // after the time
		{"delivered", "200", "3", "12ms", "—", "evt-1", "—"},
		{"retry", "503", "2", "40ms", "in 4s", "evt-1", "HTTP 503"},
		{"retry", "—", "1", "1.5s", "in 2s", "evt-1", "dial tcp: connection refused"},
	}
	gotLog := consoleCells(t, ctx, "#deliveries tbody tr")
	for i := range gotLog {
		gotLog[i] = gotLog[i][1:]
	}
	if fmt.Sprint(gotLog) != fmt.Sprint(wantLog) {
		t.Errorf("the delivery log:\n got %q\nwant %q", gotLog, wantLog)
	}
	if got, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll("#deliveries tbody tr td:nth-child(2)")].map((td) => td.className).join(" ")`)); got != "allowed-text delayed-text delayed-text" {
		t.Errorf("the outcomes' classes: %q, want allowed-text delayed-text delayed-text", got)
	}
	if bad, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](consoleBadCells)); len(bad) > 0 {
		t.Errorf("the webhooks view's cells that show nothing or a raw value: %q", bad)
	}
	shot("deliveries-1280")

	// The user's balances: llm-tokens only, no grant yet.
	box := `#subject-balances [data-entitlement="llm-tokens"]`
	within(t, ctx, 20*time.Second, "the user's balances", chromedp.Navigate(p.url+"/console/#subject/user:"+user),
		chromedp.WaitVisible(chromedp.CSS(box+" table tbody tr.none")))
	lineOf := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).innerText.trim()`, box+" .balance")))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	line := func(left, used int) string {
		b := balance()
		return fmt.Sprintf("llm-tokens: %d left · %d used · 0 overage · period %s – %s hard · every 1mo", left, used,
			b.PeriodStart.Format(time.DateOnly), b.PeriodEnd.Format(time.DateOnly))
	}
	if got, want := lineOf(), line(0, 0); got != want {
		t.Errorf("the balance without grants: %q, want %q", got, want)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#subject-balances [data-entitlement]").length`)); n != 1 {
		t.Errorf("a user's view shows %d entitlements, want llm-tokens alone (key-calls is held per API key)", n)
	}

	// A grant through the form: refused first (a rollover needs a recurring grant), the API's
	// message beside the form; then made, and listed with what it has left.
	form := box + " form"
	expires := time.Now().AddDate(1, 0, 0).Format(time.DateOnly) + " 18:00"
	within(t, ctx, 20*time.Second, "a refused grant",
		chromedp.SendKeys(chromedp.CSS(form+` [name="amount"]`), "140"),
		chromedp.SendKeys(chromedp.CSS(form+` [name="expires"]`), expires),
		chromedp.SendKeys(chromedp.CSS(form+` [name="rollover"]`), "50"),
		chromedp.SendKeys(chromedp.CSS(form+` [name="reason"]`), "console grant"),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)))
	poll.Until(t, 10*time.Second, "the refusal beside the form", pageTrue(ctx, fmt.Sprintf(`document.querySelector(%q).textContent.startsWith("rollover: only a recurring grant")`, box+" > p.error")))
	within(t, ctx, 20*time.Second, "a recurring grant", chromedp.Click(chromedp.CSS(form+` [name="recurring"]`)), chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(box+` tr[data-grant][data-state="live"]`)))
	heads := consoleCells(t, ctx, box+" thead tr")[0]
	row := func() map[string]string {
		t.Helper()
		rows := consoleCells(t, ctx, box+" tbody tr[data-grant]")
		if len(rows) != 1 {
			t.Fatalf("grants listed: %q, want one", rows)
		}
		cells := map[string]string{}
		for i, h := range heads {
			cells[h] = rows[0][i]
		}
		return cells
	}
	if got := row(); got["left"] != "140" || got["amount"] != "140" || got["state"] != "live" || got["priority"] != "1" ||
		got["recurs"] != "every 1mo, rolls over up to 50" || got["reason"] != "console grant" || got[""] != "Void" || !strings.Contains(got["expires"], expires[:4]) || !strings.HasSuffix(got["expires"], "18:00") {
		t.Errorf("the grant: %v; want 140 left of 140, live, priority 1, every 1mo rolling over up to 50, its reason, its expiry with its year (%s), a Void button",
			got, expires)
	}
	if got, want := lineOf(), line(140, 0); got != want {
		t.Errorf("the balance after the grant: %q, want %q", got, want)
	}
	if errText, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, box+" > p.error"))); errText != "" {
		t.Errorf("the refusal still shown after the grant: %q", errText)
	}
	b := balance()
	wantExpiry, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`new Date(%q).toISOString()`, strings.Replace(expires, " ", "T", 1))))
	expiry, _ := time.Parse(time.RFC3339, wantExpiry)
	if g := b.Grants; len(g) != 1 || !g[0].Recurring || g[0].Rollover == nil || g[0].Rollover.Max != 50 || g[0].Creator != "operator" ||
		expiry.IsZero() || !g[0].ExpiresAt.Equal(expiry) {
		t.Errorf("the grant as the API has it: %+v; want recurring, rollover max 50, made by operator, expiring at %s", g, wantExpiry)
	}

	// A check burns 102 of it: the view shows 38 left.
	if _, err := p.client.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/v1/chat", Cost: 102,
		Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}})); err != nil {
		t.Fatal(err)
	}
	within(t, ctx, 20*time.Second, "the balance after a check", chromedp.Click(chromedp.CSS(`#subject-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(box+` tr[data-grant][data-remaining="38"]`)))
	if got, want := lineOf(), line(38, 102); got != want {
		t.Errorf("the balance after a check of 102: %q, want %q", got, want)
	}
	if bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](consoleBadCells)); err != nil || len(bad) > 0 {
		t.Errorf("the subject view: cells blank, with a number without separators or a Go duration: %q (%v)", bad, err)
	}
	if over, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](consoleOverflows)); err != nil || len(over) > 0 {
		t.Errorf("the subject view at 1,280 px: tables wider than their box: %q (%v)", over, err)
	}
	shot("balances-1280")

	// On a phone a grant's left, amount and state are in sight.
	within(t, ctx, 20*time.Second, "the balances on a phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(p.url+"/console/#live"),
		chromedp.Navigate(p.url+"/console/#subject/user:"+user), chromedp.WaitVisible(chromedp.CSS(box+` tr[data-grant]`)))
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](fmt.Sprintf(`(() => {
		const table = document.querySelector(%q), box = table.parentElement.getBoundingClientRect();
		return [...table.querySelectorAll("thead th")].filter((th) => {
			const r = th.getBoundingClientRect();
			return th.offsetParent !== null && r.width > 0 && r.left >= box.left && r.right <= box.right + 0.5;
		}).map((th) => th.innerText.trim());
	})()`, box+" table")))
	if err != nil || !slices.Contains(shown, "left") || !slices.Contains(shown, "amount") || !slices.Contains(shown, "state") || slices.Contains(shown, "reason") {
		t.Errorf("the grants at 390 px show %q (%v); want left, amount and state, not the reason", shown, err)
	}
	shot("balances-390")
	poll.Until(t, 5*time.Second, "no horizontal scroll at 390 px", pageTrue(ctx, `document.documentElement.scrollWidth <= window.innerWidth`))

	// Void: the grant reads voided, without its button; nothing is left.
	// The view may still be drawing what the navigation above asked for (each section loads on
	// its own): the button is looked up and clicked in one step, as a person clicks what is on
	// the screen, so that a node drawn again in between is never the one clicked.
	within(t, ctx, 20*time.Second, "the view drawn at 1,280 px", chromedp.EmulateViewport(1280, 900),
		chromedp.WaitVisible(chromedp.CSS(box+` button[data-void]`)))
	poll.Until(t, 20*time.Second, "the grant voided", func() error {
		if ok, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`!!document.querySelector(%q)`, box+` tr[data-grant][data-state="voided"]`))); ok {
			return nil
		}
		_, _ = chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (b && !b.disabled) b.click(); return !!b; })()`, box+` button[data-void]`)))
		return errors.New("no voided grant yet")
	})
	if got := row(); got["state"] != "voided" || got["left"] != "38" || got[""] != "—" {
		t.Errorf("the voided grant: %v; want voided, 38 left when voided, no Void button", got)
	}
	if got, want := lineOf(), line(0, 102); got != want {
		t.Errorf("the balance after the void: %q, want %q", got, want)
	}
	if b := balance(); len(b.Grants) != 1 || b.Grants[0].VoidedAt.IsZero() {
		t.Errorf("the grant as the API has it after the void: %+v, want voided", b.Grants)
	}

	// A checker whose ClickHouse is unreachable: the endpoint is listed, the delivery log says
	// why it is not; a read token sees the balance, and its grant is refused with the API's words.
	blind := startChecker(t, "consolebalances-blind", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile, c.Redis = writeFile(t, "rules.yaml", balanceRules), redisDB(t, 13)
		c.AuditClickHouseDSN = "clickhouse://127.0.0.1:1/" + db
		c.Admin.Tokens = map[string]admin.Token{readToken: {Name: "analyst", Role: admin.RoleRead}}
	})
	within(t, ctx, 30*time.Second, "sign in to the checker without ClickHouse",
		chromedp.Navigate(blind.url+"/console/#webhooks/billing"), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS("#token"), readToken), chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#webhooks tr[data-id="billing"]`)))
	poll.Until(t, 30*time.Second, "the delivery log's message", pageTrue(ctx, `(document.querySelector("#deliveries tbody td.error") || {textContent: ""}).textContent.length > 0`))
	within(t, ctx, 20*time.Second, "the balance on a read token", chromedp.Navigate(blind.url+"/console/#subject/user:"+user),
		chromedp.WaitVisible(chromedp.CSS(box+` tr[data-grant][data-state="voided"]`)),
		chromedp.SendKeys(chromedp.CSS(form+` [name="amount"]`), "10"),
		chromedp.SendKeys(chromedp.CSS(form+` [name="reason"]`), "read token"),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)))
	poll.Until(t, 10*time.Second, "the read token's refusal beside the form", pageTrue(ctx, fmt.Sprintf(`document.querySelector(%q).textContent.includes("is read-only")`, box+" > p.error")))
	for _, proc := range []*checkerProc{p, blind} {
		if strings.Contains(proc.log.String(), "panic") {
			t.Errorf("a checker logged a panic:\n%s", proc.log)
		}
	}
}

// deliveryRow is an attempt of webhook_deliveries, at its offset from now.
type deliveryRow struct {
	ago                time.Duration
	endpoint           string
	attempt            uint32
	status             uint16
	outcome, err       string
	durationMs, nextMs uint32
}

// logDeliveries writes rows into database db's webhook delivery log, all of message evt-1.
func logDeliveries(t *testing.T, db string, rows []deliveryRow) {
	t.Helper()
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+".webhook_deliveries (at, endpoint, message_id, attempt, status, outcome, error, duration_ms, next_ms)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, r := range rows {
		if err := b.Append(now.Add(r.ago), r.endpoint, "evt-1", r.attempt, r.status, r.outcome, r.err, r.durationMs, uint64(r.nextMs)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}
