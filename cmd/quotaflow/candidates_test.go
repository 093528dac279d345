package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
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

// candidateRules give each user a live limit of 3 an hour with two candidates, one raising it
// to 5 and one a GCRA of 2, and count each address too. Sliding logs: no window boundary for
// the test to cross.
const candidateRules = `
rules:
  - {id: live, dimension: user, endpoint: /api/*, algorithm: sliding_window_log, limit: 3, window: 1h}
  - {id: raise, candidate_of: live, limit: 5}
  - {id: lower, candidate_of: live, algorithm: gcra, limit: 2}
  - {id: per-ip, dimension: ip, endpoint: /api/*, algorithm: sliding_window_log, limit: 2, window: 1h}
`

// TestLiveCandidates runs candidate rules on live traffic through the real pipeline
// (checker, NATS, aggregator, ClickHouse): their answers are recorded next to the live rule's
// in the audit, and quotaflow backtest --live-candidates (and the admin API) compares them.
func TestLiveCandidates(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	db := databaseName("candidates")
	p := startChecker(t, "lc", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile = writeFile(t, "rules.yaml", candidateRules)
		c.AuditClickHouseDSN = chSrv.DSN(db)
		c.Admin.Tokens = map[string]admin.Token{"lc-read": {Name: "analyst", Role: admin.RoleRead}}
	})
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond, InsertTimeout: 5 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	userA, userB := "lc-a-"+suffix, "lc-b-"+suffix
	check := func(user, ip string) *quotaflowv1.CheckRateLimitResponse {
		t.Helper()
		resp, err := p.client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/api/x",
			Subjects: []*quotaflowv1.Subject{
				{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user},
				{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: ip}}}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	// A: a fresh address per check, so only the user's rules deny. The live rule allows 3;
	// raise (5) would allow 2 more; lower (2) would deny the third.
	for i, want := range []struct{ live, raise, lower bool }{
		{true, true, true}, {true, true, true}, {true, true, false}, {false, true, false}, {false, true, false}, {false, false, false}, {false, false, false},
	} {
		got := map[string]bool{}
		resp := check(userA, fmt.Sprintf("10.77.%d.%d", i, time.Now().Nanosecond()%250))
		for _, l := range resp.Limits {
			got[l.RuleId] = l.Allowed
			if (l.RuleId == "raise" || l.RuleId == "lower") != (l.CandidateOf == "live") || l.CandidateOf != "" && !l.Shadow {
				t.Errorf("check %d: limit %s candidate_of %q shadow %v, want the candidates' (and only theirs) to name live, shadow", i+1, l.RuleId, l.CandidateOf, l.Shadow)
			}
		}
		if resp.Allowed != want.live || got["live"] != want.live || got["raise"] != want.raise || got["lower"] != want.lower {
			t.Errorf("check %d: allowed %v, limits %v; want allowed and live %v, raise %v, lower %v", i+1, resp.Allowed, got, want.live, want.raise, want.lower)
		}
	}
	// B: one address, whose limit of 2 denies the third and fourth checks, which the live
	// rule would allow: lower, charged by the first two, would deny them.
	for range 4 {
		check(userB, "10.78.0.1")
	}
	if err := poll.Wait(ctx, "the audit's decisions", decisionsStored(t, db, 11)); err != nil {
		t.Fatal(err)
	}

	// The recorded answers, side by side: raise would have allowed 2 of A's checks the live
	// rule denied; lower would have denied 1 of A's and 2 of B's that it allowed.
	dsn := chSrv.DSN(db)
	out, stderr, code := runCmd(ctx, []string{"backtest", "--clickhouse-dsn", dsn, "--live-candidates", "--format", "json"}, nil)
	if code != 0 {
		t.Fatalf("quotaflow backtest --live-candidates: exit %d: %s", code, stderr)
	}
	var rep backtest.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []backtest.RuleRow{
		{Rule: "lower", CandidateOf: "live", Tier: "default", Checks: 11, DeniedThen: 4, WouldDeny: 7, NewlyDenied: 3},
		{Rule: "raise", CandidateOf: "live", Tier: "default", Checks: 11, DeniedThen: 4, WouldDeny: 2, NewlyAllowed: 2},
	}
	if fmt.Sprint(rep.Rules) != fmt.Sprint(want) || rep.Checks != 22 || rep.Agreed != 17 || !rep.LiveCandidates {
		t.Errorf("live candidates: rules %+v, %d of %d agreed; want %+v, 17 of 22", rep.Rules, rep.Agreed, rep.Checks, want)
	}
	wantSubjects := []backtest.SubjectRow{{Subject: "user:" + userA, NewlyDenied: 1, NewlyAllowed: 2}, {Subject: "user:" + userB, NewlyDenied: 2}}
	if fmt.Sprint(rep.Subjects) != fmt.Sprint(wantSubjects) {
		t.Errorf("subjects %+v, want %+v", rep.Subjects, wantSubjects)
	}
	var hourChecks int64
	for _, h := range rep.Hours {
		hourChecks += h.Checks
	}
	if hourChecks != 22 {
		t.Errorf("hours %+v add up to %d checks, want 22", rep.Hours, hourChecks)
	}

	// Filtered by subject, as a table; and the admin API, as CSV.
	out, stderr, code = runCmd(ctx, []string{"backtest", "--clickhouse-dsn", dsn, "--live-candidates", "--subject", "user:" + userB}, nil)
	if code != 0 || !strings.Contains(out, "lower (candidate of live)") || !strings.Contains(out, "candidate answers compared  8") {
		t.Errorf("--subject user:%s as a table: exit %d %s%s; want B's 8 candidate answers", userB, code, out, stderr)
	}
	// Bad input names the flag, as a replay's does.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--subject", "nobody"}, "--subject:"},
		{[]string{"--from", "2000-01-01T00:00:00Z"}, "--from: 2000-01-01T00:00:00Z is outside the audit's retained history"},
		{[]string{"--top", "5000"}, "--top: 5000 is not 0 to 1000"},
		{[]string{"--warmup", "1h"}, "--warmup: a comparison of live candidates replays nothing"},
	} {
		args := append([]string{"backtest", "--clickhouse-dsn", dsn, "--live-candidates"}, tt.args...)
		if _, stderr, code := runCmd(ctx, args, nil); code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("quotaflow %s: exit %d, %q; want 2 and %q", strings.Join(args, " "), code, stderr, tt.want)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", p.url+"/api/v1/rules:backtest?format=csv", strings.NewReader(`{"live_candidates": true}`))
	req.Header.Set("Authorization", "Bearer lc-read")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "rule,raise,default,11,4,2,0,2,live") {
		t.Errorf("POST /api/v1/rules:backtest live_candidates: %d %s; want raise's row as CSV", resp.StatusCode, body)
	}
	req, _ = http.NewRequestWithContext(ctx, "POST", p.url+"/api/v1/rules:backtest", strings.NewReader(`{"live_candidates": true, "warmup": "1h"}`))
	req.Header.Set("Authorization", "Bearer lc-read")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"field":"live_candidates"`) {
		t.Errorf("live_candidates with a warmup: %d %s; want 400 naming live_candidates", resp.StatusCode, body)
	}
}

// TestDelayedAudit: a check that a rule with on_limit: delay queued is its own outcome in the
// audit (delay_us) and the rollups (delayed_requests), through the real pipeline.
func TestDelayedAudit(t *testing.T) {
	t.Parallel()
	ns := ownNATS(t)
	db := databaseName("delayed")
	p := startChecker(t, "dl", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.RulesFile = writeFile(t, "rules.yaml", `
rules:
  - {id: paced, dimension: user, endpoint: /paced, algorithm: gcra, limit: 2, window: 1s, burst: 1, on_limit: delay, max_delay: 1s}
`)
	})
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(db),
		Aggregator: aggregator.Config{FlushInterval: 100 * time.Millisecond, InsertTimeout: 5 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A slot every 500 ms and 1 s of queue: allowed, delayed twice, denied (the fourth would
	// wait 1.5 s less the time the checks took, far below 500 ms).
	user := "dl-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var got []string
	for range 4 {
		resp, err := p.client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/paced",
			Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER}))
		if err != nil {
			t.Fatal(err)
		}
		switch m := resp.Msg; {
		case !m.Allowed:
			got = append(got, "denied")
		case m.DelayUs > 0:
			got = append(got, "delayed")
		default:
			got = append(got, "allowed")
		}
	}
	if fmt.Sprint(got) != "[allowed delayed delayed denied]" {
		t.Fatalf("answers %v, want allowed, delayed twice, denied", got)
	}
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`quotaflow_checks_total{degraded="false",result="allowed"} 1`, `quotaflow_checks_total{degraded="false",result="delayed"} 2`,
		`quotaflow_checks_total{degraded="false",result="denied"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := poll.Wait(ctx, "the audit's decisions", decisionsStored(t, db, 4)); err != nil {
		t.Fatal(err)
	}
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var delayed, minDelay uint64
	if err := c.QueryRow(ctx, fmt.Sprintf("SELECT countIf(delay_us > 0), toUInt64(minIf(delay_us, delay_us > 0)) FROM %s.decisions", db)).Scan(&delayed, &minDelay); err != nil {
		t.Fatal(err)
	}
	if delayed != 2 || minDelay < 250_000 || minDelay > 500_000 {
		t.Errorf("audit: %d delayed decisions, the shortest %dµs; want 2, the first about 500ms", delayed, minDelay)
	}
	// The rollups are written after the audit's part is visible (the view's insert follows
	// the table's): polled.
	var rollup, allowed uint64
	for ctx.Err() == nil {
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT sum(delayed_requests), sum(allowed_requests) FROM %s.usage_minute", db)).Scan(&rollup, &allowed); err != nil {
			t.Fatal(err)
		}
		if allowed >= 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rollup != 2 || allowed != 3 {
		t.Errorf("usage_minute: %d delayed of %d allowed, want 2 of 3", rollup, allowed)
	}
}
