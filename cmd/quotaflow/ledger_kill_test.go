package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// TestLedgerAcrossKills: balances burned through checker and aggregator processes, the
// aggregator killed (kill -9) mid-batch and a successor started, then NATS down while checks
// go on (answered from the spool), the checker killed (kill -9) with its decisions spooled
// and unpublished, NATS back and a new checker on the same spool, then that checker killed
// with 32 workers' checks in flight (Redis charged, answers not sent) and a third on the spool,
// whose journal sweeper recovers their moves: the ledger recomputed from ClickHouse alone
// equals GetBalance for every subject, its period's usage too.
func TestLedgerAcrossKills(t *testing.T) {
	t.Parallel()
	ns, err := natstest.StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	db := databaseName("ledgerkill")
	dsn := chSrv.DSN(db)
	if out, _, code := runCmd(context.Background(), []string{"migrate", "--clickhouse-dsn", dsn}, nil); code != 0 || out == "" {
		t.Fatalf("migrate exit %d: %s", code, out)
	}
	dir := t.TempDir()
	rulesPath := writeFile(t, "rules.yaml", entitlementRules)
	spool := filepath.Join(dir, "spool")
	token := testToken()
	run := fmt.Sprintf("lk%d", time.Now().UnixNano())
	redisURL := redisSrv.URL(11)
	args := []string{"--rules", rulesPath, "--redis-url", redisURL, "--nats-url", ns.URL, "--spool-dir", spool, "--admin-token", token,
		"--instance-id", run}
	a := startCheckerProcess(t, args...)
	users := []string{run + "-ann", run + "-ben", run + "-cid"}
	for i, u := range users {
		body := fmt.Sprintf(`{"entitlement":"llm-tokens","subject":%q,"amount":%d,"recurring":true,"reason":"plan"}`, u, 5000+1000*i)
		req, _ := http.NewRequest("POST", a.url+"/api/v1/grants", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("grant to %s: %v %v", u, resp, err)
		}
		resp.Body.Close()
	}
	burn := func(url string, n int) {
		client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, url)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := w; i < n; i += 4 {
					_, err := client.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
						Identifier: users[i%len(users)], Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/v1/chat", Cost: int64(1 + i%7)}))
					if err != nil {
						t.Errorf("check: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
	}

	first := startAggregatorProcess(t, ns.URL, dsn)
	burn(a.url, 300)
	time.Sleep(700 * time.Millisecond) // fetched, not yet inserted (flush interval 1.5s)
	first.Process.Kill()               // kill -9 mid-batch
	startAggregatorProcess(t, ns.URL, dsn)
	burn(a.url, 200)

	ns.Stop()        // the checker answers from its spool
	burn(a.url, 150) // answered, spooled, unpublished
	a.kill()         // kill -9
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	b := startCheckerProcess(t, args...) // the same spool: its decisions are published now
	burn(b.url, 100)

	// Killed with checks in flight: Redis burned for checks whose decisions never reach the
	// spool, and others reached it with their journal entries still in Redis. The next
	// checker's journal sweeper publishes the entries left, and the ledger counts a decision
	// both spooled and recovered once.
	stop := make(chan struct{})
	var load sync.WaitGroup
	inFlight := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, b.url)
	for w := range 32 {
		load.Go(func() {
			for i := w; ; i += 32 {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = inFlight.CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
					Identifier: users[i%len(users)], Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/v1/chat", Cost: int64(1 + i%7)}))
			}
		})
	}
	time.Sleep(400 * time.Millisecond)
	b.kill() // kill -9 under load
	close(stop)
	load.Wait()
	b = startCheckerProcess(t, append(args, "--journal-grace", "1s")...)
	burn(b.url, 50)

	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	books, err := audit.New(audit.Config{Conn: c, Database: db})
	if err != nil {
		t.Fatal(err)
	}
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, b.url)
	for _, u := range users {
		want, err := client.GetBalance(context.Background(), connect.NewRequest(&quotaflowv1.GetBalanceRequest{Entitlement: "llm-tokens", Subject: u}))
		if err != nil {
			t.Fatal(err)
		}
		var got *audit.LedgerBalance
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got, err = books.Balance(context.Background(), "llm-tokens", "user", u, time.Now())
			if err == nil && got.Remaining == want.Msg.Remaining && got.Used == want.Msg.Used {
				break
			}
		}
		if got == nil || got.Remaining != want.Msg.Remaining || got.Used != want.Msg.Used || got.Overage != want.Msg.Overage || want.Msg.Used == 0 {
			t.Errorf("%s: the ledger says %+v (%v); GetBalance %d left, %d used, %d over", u, got, err, want.Msg.Remaining, want.Msg.Used, want.Msg.Overage)
		}
	}
}
