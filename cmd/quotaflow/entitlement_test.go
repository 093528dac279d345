package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/webhook"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

const entitlementRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: chat-rate, dimension: user, endpoint: /v1/chat, algorithm: token_bucket, limit: 1000, window: 1m}
entitlements:
  - {id: llm-tokens, dimension: user, endpoints: [/v1/chat], period: 1mo, thresholds: {used_percent: [50]}}
`

// TestEntitlementPipeline runs `quotaflow serve` whole, each part as its own NATS role: a
// webhook endpoint and a grant made through the admin API, checks of a metered endpoint
// burning the grant, and the check that crosses 50 % told once, as an entitlement event in
// ClickHouse and as a signed webhook to the endpoint, logged as delivered.
func TestEntitlementPipeline(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []events.EntitlementEvent
	var refused []string
	secret, _ := webhook.NewSecret()
	// The receiver is down when the event is first sent (its port refuses connections) and up
	// from the second attempt on, the retry schedule's 5 s later.
	hook := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := webhook.Verify(secret, r.Header, body, time.Now(), 0); err != nil {
			refused = append(refused, err.Error())
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev events.EntitlementEvent
		_ = json.Unmarshal(body, &ev)
		got = append(got, ev)
	}))
	hookAddr := freeAddr(t)
	hookURL := &url.URL{Scheme: "http", Host: hookAddr}
	defer hook.Close()

	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(entitlementRules), 0o600); err != nil {
		t.Fatal(err)
	}
	db := databaseName("ent")
	alice := fmt.Sprintf("alice-%d", time.Now().UnixNano()) // Redis outlives the run (-count=N)
	addr := freeAddr(t)
	args := []string{"serve", "--listen", addr, "--rules", rulesPath, "--redis-url", redisSrv.URL(5), "--redis-timeout", "5s", "--admin-token", "tok",
		"--nats-listen", freeAddr(t), "--nats-dir", filepath.Join(dir, "nats"), "--spool-dir", filepath.Join(dir, "spool"),
		"--clickhouse-dsn", chSrv.DSN(db), "--partitions", "1", "--flush-interval", "100ms", "--webhook-allow-hosts", hookAddr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logMu sync.Mutex
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		w := lockedWriter{&logMu, &logs}
		done <- run(ctx, args, env(nil), w, w)
	}()
	admin := func(method, path, body string) (int, string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode == http.StatusServiceUnavailable {
				if resp != nil {
					resp.Body.Close()
				}
				if time.Now().After(deadline) {
					logMu.Lock()
					defer logMu.Unlock()
					t.Fatalf("%s %s: %v\n%s", method, path, err, logs.String())
				}
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
	}
	if code, body := admin("PUT", "/api/v1/webhooks/billing", `{"url":"`+hookURL.String()+`/quota","secret":"`+secret.Text()+`"}`); code != 201 {
		t.Fatalf("PUT webhook: %d %s", code, body)
	}
	code, body := admin("POST", "/api/v1/grants", `{"id":"plan","entitlement":"llm-tokens","subject":"`+alice+`","amount":100,"reason":"pro plan"}`)
	if code != 201 {
		t.Fatalf("POST grant: %d %s", code, body)
	}
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, "http://"+addr)
	// Nine checks of 10 at once: the one that brings the period's usage to 50 of 100 crosses
	// the threshold, and only it tells.
	var wg sync.WaitGroup
	var crossed sync.Map
	for range 9 {
		wg.Go(func() {
			resp, err := client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
				Identifier: alice, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/v1/chat", Cost: 10}))
			if err != nil || !resp.Msg.Allowed {
				t.Errorf("a check of 10: %v, %v", resp, err)
				return
			}
			for _, l := range resp.Msg.Limits {
				if l.RuleId == "llm-tokens" && len(l.Told) > 0 {
					crossed.Store(resp.Msg.DecisionId, l.CurrentCount)
				}
			}
		})
	}
	wg.Wait()
	tellers := 0
	crossed.Range(func(_, used any) bool {
		tellers++
		if used.(int64) != 50 {
			t.Errorf("the crossing check left %d used, want 50", used)
		}
		return true
	})
	if tellers != 1 {
		t.Fatalf("%d checks told the crossing, want 1", tellers)
	}
	// The first attempt, refused, is in the delivery log before the receiver comes up.
	var log string
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(log, `"outcome":"retry"`); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no refused first attempt in the delivery log: %s", log)
		}
		_, log = admin("GET", "/api/v1/webhooks/billing/deliveries", "")
	}
	ln, err := net.Listen("tcp", hookAddr)
	if err != nil {
		t.Fatal(err)
	}
	hook.Listener.Close()
	hook.Listener = ln
	hook.Start()
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a duplicate would come meanwhile
	mu.Lock()
	if len(got) != 1 || got[0].Kind != events.EntitlementUsedPercent || got[0].Threshold != 50 || got[0].Subject != alice ||
		got[0].Used != 50 || got[0].Remaining != 50 || len(refused) > 0 {
		t.Errorf("webhooks %+v (refused %v); want one: used_percent 50 of alice's llm-tokens, at 50 used", got, refused)
	}
	mu.Unlock()
	ledgerMatches(t, ctx, client, admin, alice)
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var rows uint64
	for deadline := time.Now().Add(30 * time.Second); rows == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.entitlement_events WHERE entitlement = 'llm-tokens' AND subject = '%s' AND kind = 'used_percent'", db, alice)).Scan(&rows)
	}
	if rows != 1 {
		t.Errorf("entitlement_events holds %d rows of the crossing, want 1", rows)
	}
	body = ""
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(body, `"outcome":"delivered"`) && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, body = admin("GET", "/api/v1/webhooks/billing/deliveries", "")
	}
	if !strings.Contains(body, `"outcome":"delivered"`) || !strings.Contains(body, `"status":200`) || !strings.Contains(body, `"attempt":2`) ||
		!strings.Contains(body, `"outcome":"retry"`) {
		t.Errorf("the delivery log: %s, want the refused first attempt and the second, delivered", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	logMu.Lock()
	defer logMu.Unlock()
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "Permissions Violation") || strings.Contains(line, "nats refused") {
			t.Errorf("a part of serve was refused by NATS: %s", line)
		}
	}
}

// ledgerMatches moves alice's balance every way but a period's start (a second grant, a
// reservation settled below its estimate, recorded usage and its replay, a void, a denied
// check) and then finds the balance recomputed from ClickHouse's ledger alone equal to
// GetBalance's, and the month's billing export holding her period.
func ledgerMatches(t *testing.T, ctx context.Context, client quotaflowv1connect.RateLimiterClient, admin func(method, path, body string) (int, string), alice string) {
	t.Helper()
	if code, body := admin("POST", "/api/v1/grants", `{"id":"bonus","entitlement":"llm-tokens","subject":"`+alice+`","amount":50,"reason":"welcome",`+
		`"expires_at":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`); code != 201 {
		t.Fatalf("POST bonus: %d %s", code, body)
	}
	rsv, err := client.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{Estimate: 20, TtlMs: 60000,
		Check: &quotaflowv1.CheckRateLimitRequest{Identifier: alice, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/v1/llm", Entitlement: "llm-tokens"}}))
	if err != nil || rsv.Msg.ReservationId == "" {
		t.Fatalf("Reserve: %v, %v", rsv, err)
	}
	if _, err := client.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: rsv.Msg.ReservationId, Actual: 5})); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := client.RecordUsage(ctx, connect.NewRequest(&quotaflowv1.RecordUsageRequest{Entitlement: "llm-tokens", Subject: alice, Amount: 7, EventId: "resp-1"})); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := admin("POST", "/api/v1/grants/plan/void", `{"entitlement":"llm-tokens","subject":"`+alice+`"}`); code != 200 {
		t.Fatalf("void: %d %s", code, body)
	}
	if resp, err := client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Identifier: alice,
		Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/v1/llm", Entitlement: "llm-tokens", Cost: 1000})); err != nil || resp.Msg.Allowed {
		t.Fatalf("a check of 1000: %v, %v; want denied", resp, err)
	}
	want, err := client.GetBalance(ctx, connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "llm-tokens", Subject: alice}))
	if err != nil {
		t.Fatal(err)
	}
	// 100 + 50 granted; 90 + 5 + 7 used, the bonus (expiring first) burned first: 38 left of
	// it; the plan's 10 voided.
	if want.Msg.Remaining != 38 || want.Msg.Used != 102 {
		t.Fatalf("GetBalance = %v, want 38 left and 102 used", want.Msg)
	}
	var got struct {
		Remaining int64            `json:"remaining"`
		Used      int64            `json:"used"`
		Overage   int64            `json:"overage"`
		Grants    map[string]int64 `json:"grants"`
	}
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, body = admin("GET", "/api/v1/ledger/balance?entitlement=llm-tokens&dimension=user&subject="+alice, "")
		if json.Unmarshal([]byte(body), &got) == nil && got.Remaining == want.Msg.Remaining && got.Used == want.Msg.Used {
			break
		}
	}
	if got.Remaining != want.Msg.Remaining || got.Used != want.Msg.Used || got.Overage != want.Msg.Overage || got.Grants["plan"] != 0 || got.Grants["bonus"] != 38 {
		t.Errorf("the ledger's balance %s; GetBalance's %v", body, want.Msg)
	}
	for _, bad := range []struct{ path, field string }{
		{"/api/v1/billing?period=2026-13", "period"},
		{"/api/v1/billing?period=2026-11&format=xml", "format"},
		{"/api/v1/ledger/balance?entitlement=llm-tokens&dimension=user", "entitlement"},
	} {
		if code, body := admin("GET", bad.path, ""); code != 400 || !strings.Contains(body, `"field":"`+bad.field+`"`) {
			t.Errorf("GET %s: %d %s, want 400 naming %s", bad.path, code, body, bad.field)
		}
	}
	_, csv := admin("GET", "/api/v1/billing?format=csv&period="+time.Now().UTC().Format("2006-01"), "")
	if !strings.HasPrefix(csv, "entitlement,dimension,subject,period_start,period_end,granted,used,overage,forfeited\n") ||
		!strings.Contains(csv, "\nllm-tokens,user,"+alice+",") || !strings.Contains(csv, ",150,102,0,10\n") {
		t.Errorf("the billing export:\n%s\nwant alice's period: 150 granted, 102 used, 10 forfeited", csv)
	}
}
