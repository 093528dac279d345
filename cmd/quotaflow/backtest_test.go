package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/backtest"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// backtestRules has a rule of each exact algorithm per user, a global one and a counted custom
// dimension (Envoy's semantics) under /api/shared, and a daily bucket of its own for the test
// of a lowered limit. The windows are short, so that the answers depend on Redis's instants.
const backtestRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: fw, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 9, window: 1s}
  - {id: tb, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 10, window: 1s, burst: 6}
  - {id: gcra, dimension: user, endpoint: /api/*, algorithm: gcra, limit: 12, window: 1s, burst: 5}
  - {id: log, dimension: user, endpoint: /api/*, algorithm: sliding_window_log, limit: 7, window: 1s}
  - {id: global, dimension: global, endpoint: /api/shared/*, algorithm: token_bucket, limit: 200, window: 1s}
  - {id: tenant, dimension: tenant, endpoint: /api/shared/*, algorithm: fixed_window, limit: 150, window: 1s, count_denied: true}
  - {id: solo-day, dimension: user, endpoint: /solo, algorithm: token_bucket, limit: 10, window: 24h}
`

// TestBacktest records a history through the real pipeline (checker, NATS, aggregator,
// ClickHouse) from concurrent clients, so that checks of one bucket meet in one batch script
// run, then replays it with quotaflow backtest: under the rules that decided, every answer
// is the recorded one; under a lowered limit, exactly the checks past it are newly denied.
func TestBacktest(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	db := databaseName("backtest")
	rulesFile := writeFile(t, "rules.yaml", backtestRules)
	p := startChecker(t, "bt", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile, c.Redis = rulesFile, redisDB(t, 14)
		c.AuditClickHouseDSN = chSrv.DSN(db)
		c.Admin.Tokens = map[string]admin.Token{"bt-read": {Name: "analyst", Role: admin.RoleRead}}
	})
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond, InsertTimeout: 5 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()

	// 8 clients for 1.5 s over 20 users, then 1.5 s more over 3 tenants too: allowed and
	// denied by every rule. The first phase's checks are one subject's, decided by one script
	// call each; the second's charge several subjects' buckets, refunded when one denies.
	var checks, allowed atomic.Int64
	load := func(endpoint string, until time.Time) {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), uint64(until.UnixNano())))
				for time.Now().Before(until) && ctx.Err() == nil {
					req := connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: endpoint, Cost: int64(1 + rng.IntN(2)),
						Subjects: []*quotaflowv1.Subject{
							{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: fmt.Sprintf("bt-user-%d", rng.IntN(20))},
							{CustomDimension: "tenant", Identifier: fmt.Sprintf("t,=%d", rng.IntN(3))}}})
					resp, err := p.client.CheckRateLimit(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					checks.Add(1)
					if resp.Msg.Allowed {
						allowed.Add(1)
					}
					time.Sleep(time.Duration(5+rng.IntN(5)) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}
	load("/api/items", start.Add(1500*time.Millisecond))
	single := checks.Load()
	shared := time.Now()
	load("/api/shared/items", shared.Add(1500*time.Millisecond))
	// 15 checks of one user against a daily bucket of 10: 10 allowed. The user is the run's
	// own: the bucket outlives a run (go test -count), the audit's database does not.
	solo := "bt-solo-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for range 15 {
		req := connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/solo",
			Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: solo}}})
		if _, err := p.client.CheckRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
		checks.Add(1)
	}
	n := checks.Load()
	t.Logf("%d checks recorded, %d of the concurrent ones allowed", n, allowed.Load())
	if allowed.Load() == 0 || allowed.Load() == n-15 || single == 0 || single == n-15 {
		t.Fatalf("%d of %d allowed: want both answers", allowed.Load(), n-15)
	}
	if err := poll.Wait(ctx, "the audit's decisions", decisionsStored(t, db, n)); err != nil {
		t.Fatal(err)
	}

	dsn := chSrv.DSN(db)
	from := start.Add(-time.Second).UTC().Format(time.RFC3339Nano)
	run := func(rulesPath string, extra ...string) backtest.Report {
		t.Helper()
		args := append([]string{"backtest", "--clickhouse-dsn", dsn, "--rules", rulesPath, "--from", from, "--format", "json"}, extra...)
		out, stderr, code := runCmd(ctx, args, nil)
		if code != 0 {
			t.Fatalf("quotaflow %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		var rep backtest.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return rep
	}

	// One subject's checks: every answer replayed as recorded.
	rep := run(rulesFile, "--to", shared.UTC().Format(time.RFC3339Nano))
	if rep.Checks != single || rep.Agreed != single {
		t.Errorf("one subject's checks, the rules that decided: %d of %d replayed with the recorded answer (reasons %v), want all %d",
			rep.Agreed, rep.Checks, rep.Reasons, single)
	}
	// The admin API replays the rules in force when given none, for a read token.
	api := func(body, query string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", p.url+"/api/v1/rules:backtest"+query, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer bt-read")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	window := fmt.Sprintf(`{"from": %q, "to": %q}`, from, shared.UTC().Format(time.RFC3339Nano))
	code, body := api(window, "")
	var viaAPI backtest.Report
	if err := json.Unmarshal([]byte(body), &viaAPI); code != 200 || err != nil || viaAPI.Checks != single || viaAPI.Agreed != single {
		t.Errorf("POST /api/v1/rules:backtest: %d %s; want %d checks, all with the recorded answer", code, body, single)
	}
	if code, body := api(window, "?format=csv"); code != 200 || !strings.HasPrefix(body, "part,name,tier,checks") ||
		!strings.Contains(body, fmt.Sprintf("summary,all,,%d,", single)) {
		t.Errorf("POST /api/v1/rules:backtest?format=csv: %d %s; want the report as CSV", code, body)
	}
	// A checker's backtests are bounded (backtest.InChecker): a document of more rules is
	// refused before anything is read.
	var many strings.Builder
	for i := range backtest.InChecker.MaxRules + 1 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `{"id":"r%d","dimension":"user","endpoint":"*","algorithm":"fixed_window","limit":5,"window":"%ds"}`, i, i+1)
	}
	for _, tt := range []struct{ body, field string }{
		{fmt.Sprintf(`{"from": %q, "rules": {"rules": [%s]}}`, from, many.String()), "rules"},
		{`{"to": "2026-01-01T00:00:00Z"}`, "from"},
		{`{"from": "2001-01-01T00:00:00Z"}`, "from"},
		{fmt.Sprintf(`{"from": %q, "rule": "nope"}`, from), "rule"},
		{fmt.Sprintf(`{"from": %q, "warmup": "soon"}`, from), "warmup"},
	} {
		var e admin.Error
		if code, body := api(tt.body, ""); code != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Field != tt.field {
			t.Errorf("POST %s: %d %s; want 400 naming %s", tt.body, code, body, tt.field)
		}
	}

	// Every check: an answer that differs comes right after a charge Redis refunded later.
	rep = run(rulesFile)
	if rep.Checks != n || rep.Agreed+rep.Reasons[backtest.ReasonRefund] != n || len(rep.Reasons) > 1 {
		t.Errorf("the rules that decided: %d of %d checks replayed with the recorded answer, reasons %v; want every other one explained by %s",
			rep.Agreed, rep.Checks, rep.Reasons, backtest.ReasonRefund)
	}
	t.Logf("replayed %d checks: %d with the recorded answer, reasons %v", rep.Checks, rep.Agreed, rep.Reasons)

	lowered := writeFile(t, "lowered.yaml", strings.Replace(backtestRules, "limit: 10, window: 24h", "limit: 4, window: 24h", 1))
	rep = run(lowered, "--subject", "user:"+solo)
	want := backtest.RuleRow{Rule: "solo-day", Tier: "free", Checks: 15, DeniedThen: 5, WouldDeny: 11, NewlyDenied: 6}
	if rep.Checks != 15 || rep.NewlyDenied != 6 || rep.NewlyAllowed != 0 || len(rep.Rules) != 1 || rep.Rules[0] != want {
		t.Errorf("a limit of 4 instead of 10: %d checks, %d newly denied, %d newly allowed, rules %+v; want 15, 6, 0, %+v",
			rep.Checks, rep.NewlyDenied, rep.NewlyAllowed, rep.Rules, want)
	}
	if len(rep.Subjects) != 1 || rep.Subjects[0].Subject != "user:"+solo || len(rep.Hours) == 0 {
		t.Errorf("subjects %+v, hours %+v; want %s and its hours", rep.Subjects, rep.Hours, solo)
	}

	// Bad input names the flag.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rules", rulesFile, "--rule", "nope"}, `--rule: no rule "nope"`},
		{[]string{"--rules", rulesFile, "--from", "2000-01-01T00:00:00Z"}, "--from: 2000-01-01T00:00:00Z is outside the audit's retained history"},
		{[]string{"--rules", rulesFile, "--from", "yesterday"}, "--from: \"yesterday\" is neither"},
		{[]string{"--from", "1h"}, "--rules: required"},
		{[]string{"--rules", rulesFile, "--format", "xml"}, "--format"},
		{[]string{"--rules", rulesFile, "--from", from, "--max-records", "5"}, "--from: the window and its warm-up hold"},
		{[]string{"--rules", rulesFile, "--from", from, "--max-rules", "1"}, "a backtest here replays at most 1"},
	} {
		args := append([]string{"backtest", "--clickhouse-dsn", dsn}, tt.args...)
		if _, stderr, code := runCmd(ctx, args, nil); code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("quotaflow %s: exit %d, %q; want 2 and %q", strings.Join(args, " "), code, stderr, tt.want)
		}
	}
}

// decisionsStored is the condition that db's audit holds at least n decisions; its connection
// closes with the test.
func decisionsStored(t *testing.T, db string, n int64) func(context.Context) error {
	t.Helper()
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func(ctx context.Context) error {
		var got uint64
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.decisions", db)).Scan(&got); err != nil {
			return err
		}
		if int64(got) < n {
			return fmt.Errorf("%s.decisions holds %d decisions, want %d", db, got, n)
		}
		return nil
	}
}
