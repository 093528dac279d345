package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// degradedRules: api denies past 2 an hour and, without Redis, denies everything (closed);
// open-api lets everything through without Redis (open).
const degradedRules = `
rules:
  - {id: api, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 2, window: 1h, fail_mode: closed}
  - {id: open-api, dimension: user, endpoint: /open/*, algorithm: fixed_window, limit: 100, window: 1h, fail_mode: open}
`

// TestDegradedRollups: decisions answered by a fail mode, through the real pipeline (a checker
// whose Redis is a closed port, one whose Redis answers, NATS, the aggregator, ClickHouse), are
// counted apart in the rollups (degraded_requests, degraded_denied), the documented denials
// query counts only the limit's denial as throttling, and tier protection's rate counts the
// checks a fail mode let through.
func TestDegradedRollups(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	db := databaseName("degraded")
	rulesFile := writeFile(t, "rules.yaml", degradedRules)
	up := startChecker(t, "dg-up", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) { c.RulesFile = rulesFile })
	// down's Redis, a server of its own, is killed once the checker is ready (it is not ready
	// without Redis): every check's Redis call is refused from then on.
	lost, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lost.Close)
	down := startChecker(t, "dg-down", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile = rulesFile
		c.Redis = redis.NewClient(&redis.Options{Addr: lost.Addr, MaxRetries: -1, DialerRetries: 1})
	})
	lost.Stop()
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond, InsertTimeout: 5 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	var got []string
	check := func(p *checkerProc, user, endpoint string) {
		t.Helper()
		resp, err := p.client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: endpoint,
			Identifier: user + "-" + suffix, Dimension: quotaflowv1.Dimension_DIMENSION_USER}))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s allowed=%v degraded=%v", endpoint, resp.Msg.Allowed, resp.Msg.Degraded))
	}
	// Throttling: the limit allows 2 of 3.
	for range 3 {
		check(up, "throttled", "/api/x")
	}
	// Redis unreachable: 4 fail-closed denials, 3 fail-open allowances.
	for range 4 {
		check(down, "outage", "/api/x")
	}
	for range 3 {
		check(down, "outage", "/open/x")
	}
	want := strings.Repeat("/api/x allowed=true degraded=false ", 2) + "/api/x allowed=false degraded=false " +
		strings.Repeat("/api/x allowed=false degraded=true ", 4) + strings.Repeat("/open/x allowed=true degraded=true ", 3)
	if g := strings.Join(got, " ") + " "; g != want {
		t.Fatalf("answers:\n%s\nwant:\n%s", g, want)
	}

	if err := poll.Wait(ctx, "the audit's decisions", decisionsStored(t, db, 10)); err != nil {
		t.Fatal(err)
	}
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The rollups are written after the audit's part is visible: polled.
	for _, table := range []string{"usage_minute", "usage_hour", "usage_day"} {
		q := fmt.Sprintf("SELECT sum(requests), sum(allowed_requests), sum(denied_requests), sum(degraded_requests), sum(degraded_denied) FROM %s.%s", db, table)
		var sums [5]uint64
		for ctx.Err() == nil {
			if err := c.QueryRow(ctx, q).Scan(&sums[0], &sums[1], &sums[2], &sums[3], &sums[4]); err != nil {
				t.Fatal(err)
			}
			if sums[0] >= 10 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if want := [5]uint64{10, 5, 5, 7, 4}; sums != want {
			t.Errorf("%s: requests, allowed, denied, degraded, degraded denied = %v, want %v", table, sums, want)
		}
	}

	// The documented query: api's one denial by its limit is throttling, its four by the fail
	// mode are apart; open-api denied nothing.
	sql := docQuery(t, "Denials by rule")
	rows, err := c.Query(ctx, strings.ReplaceAll(sql, "quotaflow.", db+"."))
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	var report []string
	for rows.Next() {
		var rule string
		var denied int64
		var total, failDenied uint64
		var share, failShare float64
		if err := rows.Scan(&rule, &denied, &total, &share, &failDenied, &failShare); err != nil {
			t.Fatal(err)
		}
		report = append(report, fmt.Sprintf("%s denied=%d of %d share=%v fail_mode_denied=%d share=%v", rule, denied, total, share, failDenied, failShare))
	}
	rows.Close()
	if g, want := strings.Join(report, "; "), "api denied=1 of 7 share=0.1429 fail_mode_denied=4 share=0.5714"; g != want {
		t.Errorf("Denials by rule: %s, want %s", g, want)
	}

	// Tier protection counts what reached the upstream: the 2 checks the limit allowed and the
	// 3 the open fail mode let through.
	var tier string
	if err := c.QueryRow(ctx, "SELECT any(tier) FROM "+db+".decisions").Scan(&tier); err != nil {
		t.Fatal(err)
	}
	rate, err := aggregator.ClickHouseTierRate(c, db)(ctx, tier, time.Now().Add(-time.Hour))
	if err != nil || rate != 5 {
		t.Errorf("tier protection's rate of tier %q = %d, %v; want 5 (fail-open checks included)", tier, rate, err)
	}
}

// docQuery returns the sql block under a ## heading of docs/queries.md.
func docQuery(t *testing.T, section string) string {
	t.Helper()
	f, err := os.Open("../../docs/queries.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var in, inSQL bool
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = strings.TrimPrefix(l, "## ") == section
		case in && l == "```sql":
			inSQL = true
		case inSQL && l == "```":
			return strings.Join(lines, "\n")
		case inSQL:
			lines = append(lines, l)
		}
	}
	t.Fatalf("docs/queries.md: no sql block under ## %s (%v)", section, sc.Err())
	return ""
}
