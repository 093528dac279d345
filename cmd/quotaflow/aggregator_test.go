package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// startAggregatorProcess runs `quotaflow aggregator` as a child process (the test binary
// re-executed), so that the test can kill -9 it.
func startAggregatorProcess(t *testing.T, natsURL, dsn string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "aggregator", "--nats-url", natsURL, "--clickhouse-dsn", dsn,
		"--listen", freeAddr(t), "--flush-interval", "1500ms", "--insert-timeout", "1s", "--pinned-ttl", "2s", "--ack-wait", "3s",
		"--log-level", "warn")
	cmd.Env = append(os.Environ(), asCheckerEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			t.Errorf("aggregator process did not stop on SIGINT")
		}
	})
	return cmd
}

// TestAggregatorEndToEnd: checks through a real checker land in ClickHouse exactly once,
// across a kill -9 of the aggregator mid-batch and a restart of NATS (the checker's and the
// aggregator's connections drop) while checks go on.
func TestAggregatorEndToEnd(t *testing.T) {
	t.Parallel()
	ns, err := natstest.StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	db := databaseName("e2e")
	dsn := chSrv.DSN(db)
	if out, _, code := runCmd(context.Background(), []string{"migrate", "--clickhouse-dsn", dsn}, nil); code != 0 || out == "" {
		t.Fatalf("migrate exit %d: %s", code, out)
	}
	p := startChecker(t, "e2e", ns.URL, t.TempDir())

	var mu sync.Mutex
	ids := map[string]bool{}
	check := func(n int, tag string) {
		for i := 0; i < n; i++ {
			resp, err := p.client.CheckRateLimit(context.Background(), userCheck(fmt.Sprintf("e2e-%s-%d", tag, i%20)))
			if err != nil {
				t.Errorf("check: %v", err)
				return
			}
			mu.Lock()
			ids[resp.Msg.DecisionId] = true
			mu.Unlock()
		}
	}

	first := startAggregatorProcess(t, ns.URL, dsn)
	check(300, "a")
	time.Sleep(700 * time.Millisecond) // fetched, not yet inserted (flush interval 1.5s)
	first.Process.Kill()               // kill -9 mid-batch: nothing acked, nothing lost
	check(200, "b")
	ns.Stop() // the checker spools, the next aggregator cannot connect yet
	outage := make(chan struct{})
	go func() { defer close(outage); check(100, "c") }()
	time.Sleep(300 * time.Millisecond)
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	<-outage
	startAggregatorProcess(t, ns.URL, dsn)
	check(100, "d")

	const want = 700
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := func(q string) uint64 {
		var n uint64
		if err := c.QueryRow(context.Background(), fmt.Sprintf(q, db)).Scan(&n); err != nil {
			return 0
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for count("SELECT count() FROM %s.decisions") < want {
		if time.Now().After(deadline) {
			t.Fatalf("decisions holds %d rows after 60s, want %d", count("SELECT count() FROM %s.decisions"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive now
	mu.Lock()
	if len(ids) != want {
		t.Errorf("%d distinct decision ids answered, want %d", len(ids), want)
	}
	mu.Unlock()
	for _, q := range []string{
		"SELECT count() FROM %s.decisions",
		"SELECT uniqExact(id) FROM %s.decisions",
		"SELECT sum(requests) FROM %s.usage_minute",
		"SELECT sum(requests) FROM %s.usage_hour",
		"SELECT sum(requests) FROM %s.usage_day",
		"SELECT sum(decisions) FROM %s.ingested_messages",
	} {
		if got := count(q); got != want {
			t.Errorf("%s = %d, want %d", fmt.Sprintf(q, db), got, want)
		}
	}
}

// TestServeWithAggregator runs `quotaflow serve` with a ClickHouse, so with the aggregator in
// process on the embedded NATS: checks land in ClickHouse, the aggregator's metrics are on
// /metrics, every log line names its component at most once, and Ctrl-C stops it cleanly.
func TestServeWithAggregator(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(pipelineRules), 0o600); err != nil {
		t.Fatal(err)
	}
	db := databaseName("serve")
	addr := freeAddr(t)
	args := []string{"serve", "--listen", addr, "--rules", rulesPath, "--redis-url", redisSrv.URL(5), "--redis-timeout", "5s", // counted: never degraded
		"--nats-listen", freeAddr(t), "--nats-dir", filepath.Join(dir, "nats"), "--spool-dir", filepath.Join(dir, "spool"),
		"--clickhouse-dsn", chSrv.DSN(db), "--partitions", "2", "--flush-interval", "100ms"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logMu sync.Mutex
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		w := lockedWriter{&logMu, &logs}
		done <- run(ctx, args, env(nil), w, w)
	}()
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, "http://"+addr)
	const want = 20
	for i := 0; i < want; {
		if _, err := client.CheckRateLimit(ctx, userCheck(fmt.Sprintf("serve-agg-%d", i))); err != nil {
			select {
			case err := <-done:
				t.Fatalf("serve exited at start: %v\n%s", err, logs.String())
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		i++
	}
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got uint64
	for deadline := time.Now().Add(30 * time.Second); got < want && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.decisions", db)).Scan(&got)
	}
	if got != want {
		t.Errorf("%s.decisions holds %d of the checks, want %d", db, got, want)
	}
	// The aggregator's instruments are on serve's /metrics, beside the checker's: docs/aggregator.md
	// points to consumer lag there. (Its gauges are observed at every scrape; a counter shows
	// from its first increment, which may follow the rows' arrival in ClickHouse.)
	metrics := scrape(t, "http://"+addr+"/metrics")
	for _, name := range []string{"quotaflow_aggregator_consumer_lag", "quotaflow_aggregator_partitions_owned", "quotaflow_checks_total"} {
		if !strings.Contains(metrics, "\n"+name) {
			t.Errorf("serve's /metrics has no %s", name)
		}
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
	out := logs.String()
	logMu.Unlock()
	if !strings.Contains(out, "component=aggregator") {
		t.Errorf("no log line of the aggregator's component:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Count(line, "component=") > 1 {
			t.Errorf("component named twice: %s", line)
		}
		// Each part connects as its own NATS role (package natsauth): none may be refused.
		if strings.Contains(line, "nats refused") || strings.Contains(line, "Permissions Violation") {
			t.Errorf("a part of serve was refused by NATS: %s", line)
		}
	}
}

// databaseName is a ClickHouse database of the test's own: the server outlives the process,
// and go test -count=N runs a test again in the same one.
func databaseName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), databaseSeq.Add(1))
}

var databaseSeq atomic.Int64

// scrape returns the body of a GET of url, failing the test on anything but a 200.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body)
}
