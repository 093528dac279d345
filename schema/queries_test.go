package schema_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/schema"
)

// docQuery is one ```sql block of docs/queries.md and the section heading above it.
type docQuery struct {
	section, sql string
}

// parseQueriesDoc returns the ```sql blocks of a markdown file, each with its ## heading.
func parseQueriesDoc(path string) ([]docQuery, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		qs      []docQuery
		section string
		block   []string
		inSQL   bool
		line    int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line++
		l := sc.Text()
		switch {
		case inSQL && strings.TrimSpace(l) == "```":
			qs = append(qs, docQuery{section: section, sql: strings.Join(block, "\n")})
			block, inSQL = nil, false
		case inSQL:
			block = append(block, l)
		case strings.TrimSpace(l) == "```sql":
			if section == "" {
				return nil, fmt.Errorf("%s:%d: sql block before any ## heading", path, line)
			}
			inSQL = true
		case strings.HasPrefix(l, "## "):
			section = strings.TrimSpace(strings.TrimPrefix(l, "## "))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if inSQL {
		return nil, fmt.Errorf("%s: unterminated sql block in section %q", path, section)
	}
	return qs, nil
}

// result is a query's rows, read through the column types.
type result struct{ clickhousetest.Answer }

func runQuery(ctx context.Context, c driver.Conn, q string) (result, error) {
	r, err := clickhousetest.Query(ctx, c, q)
	return result{r}, err
}

// col returns the values of the named column, failing the test if there is none.
func (r result) col(t *testing.T, section, name string) []any {
	t.Helper()
	i := slices.Index(r.Cols, name)
	if i < 0 {
		t.Fatalf("%s: no column %q in %v", section, name, r.Cols)
	}
	vs := make([]any, len(r.Rows))
	for j, row := range r.Rows {
		vs[j] = row[i]
	}
	return vs
}

// sumInt adds up an integer column.
func (r result) sumInt(t *testing.T, section, name string) int64 {
	t.Helper()
	var n int64
	for _, v := range r.col(t, section, name) {
		n += toInt(t, v)
	}
	return n
}

func toInt(t *testing.T, v any) int64 {
	t.Helper()
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(rv.Uint())
	}
	t.Fatalf("%v (%T) is not an integer", v, v)
	return 0
}

// qdecision is a row of the test's decisions.
type qdecision struct {
	tier, dim, subject, endpoint, rule string
	allowed, shadow                    bool
	shadowRule                         string // the shadow limit that would have denied
	// candidate is the answer of the rule's candidate (rule + "-candidate"): 0 for none, 1
	// allowed, 2 denied.
	candidate int
	// degraded is an answer of the rule's fail mode (open when allowed, closed when denied),
	// given by checker-c, whose Redis did not answer.
	degraded bool
}

// TestQueriesDoc runs every query of docs/queries.md on Debian's ClickHouse against realistic
// decisions and checks that each answers, and answers right. TestReplicated runs them again on
// a cluster.
func TestQueriesDoc(t *testing.T) {
	t.Parallel()
	c := conn(t)
	if err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS queries_test"); err != nil {
		t.Fatal(err)
	}
	checkQueriesDoc(t, c, c, "queries_test", schema.Layout{})
}

// checkQueriesDoc migrates db in the layout through c, stores the queries' fixture through
// c, and runs and checks every query of docs/queries.md through read, once it holds the
// fixture (another replica of a cluster gets it by replication).
func checkQueriesDoc(t *testing.T, c, read driver.Conn, db string, l schema.Layout) {
	t.Helper()
	queries, err := parseQueriesDoc("../docs/queries.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 6 {
		t.Fatalf("docs/queries.md has %d sql blocks, want at least 6", len(queries))
	}
	ctx := context.Background()
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, _, err := l.Migrate(mctx, c, db); err != nil {
		t.Fatal(err)
	}

	// The traffic of the last hour: bob is denied most, alice sometimes, an IP and an API key
	// now and then; two subjects trip a shadow rule without being denied.
	var ds []qdecision
	add := func(n int, d qdecision) {
		for range n {
			ds = append(ds, d)
		}
	}
	// A candidate of alice's search rule would have denied 2 of the 7 checks the rule allowed,
	// and allowed 1 of the 4 it denied.
	add(5, qdecision{tier: "free", dim: "user", subject: "alice", endpoint: "/v1/search", rule: "free-user-search", allowed: true, candidate: 1})
	add(2, qdecision{tier: "free", dim: "user", subject: "alice", endpoint: "/v1/search", rule: "free-user-search", allowed: true, candidate: 2})
	add(1, qdecision{tier: "free", dim: "user", subject: "alice", endpoint: "/v1/search", rule: "free-user-search", candidate: 1})
	add(3, qdecision{tier: "free", dim: "user", subject: "alice", endpoint: "/v1/search", rule: "free-user-search", candidate: 2})
	add(1, qdecision{tier: "free", dim: "user", subject: "alice", endpoint: "/v1/orders", rule: "free-user-orders"})
	add(6, qdecision{tier: "pro", dim: "user", subject: "bob", endpoint: "/v1/orders", rule: "pro-user-orders", allowed: true})
	add(14, qdecision{tier: "pro", dim: "user", subject: "bob", endpoint: "/v1/orders", rule: "pro-user-orders"})
	add(3, qdecision{tier: "free", dim: "ip", subject: "203.0.113.7", endpoint: "/v1/search", rule: "ip-burst", allowed: true})
	add(3, qdecision{tier: "free", dim: "ip", subject: "203.0.113.7", endpoint: "/v1/search", rule: "ip-burst"})
	add(8, qdecision{tier: "enterprise", dim: "api_key", subject: "ak_live_123", endpoint: "/v1/upload", rule: "api-key-upload", allowed: true})
	add(2, qdecision{tier: "enterprise", dim: "api_key", subject: "ak_live_123", endpoint: "/v1/upload", rule: "api-key-upload"})
	add(5, qdecision{tier: "enterprise", dim: "global", subject: "*", endpoint: "/v1/upload", rule: "global-upload", allowed: true})
	add(4, qdecision{tier: "free", dim: "ip", subject: "198.51.100.9", endpoint: "/v1/search", rule: "ip-burst", allowed: true, shadow: true, shadowRule: "ip-strict-shadow"})
	// carol's candidate would deny too: it is no shadow rule's denial.
	add(2, qdecision{tier: "pro", dim: "user", subject: "carol", endpoint: "/v1/orders", rule: "pro-user-orders", allowed: true, shadow: true, shadowRule: "pro-orders-shadow", candidate: 2})
	// A Redis outage seen by checker-c: the global rule's fail mode (closed) denied 20 checks,
	// more than any limit denied anyone, which is no throttling; the IP rule's (open) allowed 2.
	add(20, qdecision{tier: "free", dim: "global", subject: "*", endpoint: "/v1/api", rule: "global-api", degraded: true})
	add(2, qdecision{tier: "free", dim: "ip", subject: "203.0.113.7", endpoint: "/v1/search", rule: "ip-burst", allowed: true, degraded: true})

	// denied are the limits' denials; degraded the fail modes' answers, degradedDenied their denials.
	var aliceRows, denied, shadowed, degraded, degradedDenied int64
	shadowSubjects := map[string]bool{}
	for _, d := range ds {
		if d.dim == "user" && d.subject == "alice" {
			aliceRows++
		}
		switch {
		case d.degraded && !d.allowed:
			degraded++
			degradedDenied++
		case d.degraded:
			degraded++
		case !d.allowed:
			denied++
		}
		if d.shadow {
			shadowed++
			shadowSubjects[d.subject] = true
		}
	}

	b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.Decisions)+" (id, checker_id, time, time_us, subject_dimension, subject_id, subjects, tier, endpoint, rule_id, algorithm, cost, allowed, shadow, degraded, fail_mode, limit_value, remaining, current_count, window_ms, reset_at, retry_after_ms, state, replayed, clock_skew_ms, limits.rule_id, limits.shadow, limits.allowed, limits.dimension, limits.identifier, limits.candidate_of, partition, stream_seq, batch_id, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for i, d := range ds {
		at := now.Add(-time.Duration(len(ds)-i) * 30 * time.Second) // oldest first, all within 45 minutes
		const limit = 10
		remaining, state, retry, allowed := int64(limit-1-i%limit), "normal", int64(0), uint8(1)
		if remaining < 2 {
			state = "warning"
		}
		if !d.allowed {
			remaining, state, retry, allowed = 0, "throttled", 1500, 0
		}
		shadow := uint8(0)
		limitRules, limitShadow, limitAllowed := []string{d.rule}, []uint8{0}, []uint8{allowed}
		if d.shadow {
			shadow = 1
			limitRules, limitShadow, limitAllowed = append(limitRules, d.shadowRule), append(limitShadow, 1), append(limitAllowed, 0)
		}
		limitCandidateOf := make([]string, len(limitRules))
		if d.candidate > 0 {
			limitRules, limitShadow, limitAllowed = append(limitRules, d.rule+"-candidate"), append(limitShadow, 1), append(limitAllowed, uint8(2-d.candidate))
			limitCandidateOf = append(limitCandidateOf, d.rule)
		}
		limitDims, limitIDs := make([]string, len(limitRules)), make([]string, len(limitRules))
		for j := range limitRules {
			limitDims[j], limitIDs[j] = d.dim, d.subject
		}
		checker, degraded, failMode := "checker-a", uint8(0), "open"
		if d.degraded {
			checker, degraded = "checker-c", 1
			if !d.allowed {
				failMode = "closed"
			}
		}
		if err := b.Append(
			fmt.Sprintf("%s-%d", checker, i+1), checker, at, at.UnixMicro(),
			d.dim, d.subject, []string{d.dim + ":" + d.subject}, d.tier, d.endpoint, d.rule, "sliding_window",
			int64(1), allowed, shadow, degraded, failMode,
			int64(limit), remaining, int64(limit)-remaining, int64(60000), at.Add(time.Minute).Truncate(time.Second), retry,
			state, uint8(0), int64(0),
			limitRules, limitShadow, limitAllowed, limitDims, limitIDs, limitCandidateOf,
			uint16(i%4), uint64(i+1), "batch-1", now,
		); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}

	// Reservations (migration 0007's columns): dave's r1 reserves 4000 and settles at 1250, r2
	// reserves 1000 and settles at 1500 past the limit, r3 reserves 300 and is never settled
	// (its estimate stands); a release of a lease is no request.
	type qkind struct {
		kind, rid, lease       string
		cost, estimate, actual int64
		overage                uint8
	}
	kinds := []qkind{
		{kind: "reserve", rid: "r1", cost: 4000, estimate: 4000},
		{kind: "settle", rid: "r1", cost: -2750, estimate: 4000, actual: 1250},
		{kind: "reserve", rid: "r2", cost: 1000, estimate: 1000},
		{kind: "settle", rid: "r2", cost: 500, estimate: 1000, actual: 1500, overage: 1},
		{kind: "reserve", rid: "r3", cost: 300, estimate: 300},
		{kind: "lease_release", lease: "h.x"},
	}
	kb, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.Decisions)+" (id, checker_id, time, time_us, subject_dimension, subject_id, tier, endpoint, rule_id, cost, allowed, kind, reservation_id, estimated_cost, actual_cost, overage, lease_id, partition, stream_seq, batch_id, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kinds {
		at := now.Add(-time.Duration(len(kinds)-i) * time.Minute)
		if err := kb.Append(fmt.Sprintf("checker-b-%d", i+1), "checker-b", at, at.UnixMicro(), "user", "dave", "pro", "/v1/generate", "pro-tokens",
			k.cost, uint8(1), k.kind, k.rid, k.estimate, k.actual, k.overage, k.lease, uint16(5), uint64(i+1), "batch-2", now); err != nil {
			t.Fatal(err)
		}
	}
	if err := kb.Send(); err != nil {
		t.Fatal(err)
	}
	reserves := int64(3)                    // the rows of kinds that are requests
	const ledgerChecks, ledgerCost = 2, 100 // ledgerFixture's checks, which burned erin's balance

	// The configuration changes: three today, one two days ago (outside the last day).
	type qchange struct {
		age                         time.Duration
		actor, action, target, tier string
	}
	changes := []qchange{
		{48 * time.Hour, "alice-ops", "rule_created", "old-rule", ""},
		{3 * time.Hour, "seed", "rules_seeded", "", ""},
		{2 * time.Hour, "alice-ops", "rule_replaced", "free-user-search", ""},
		{time.Hour, "ci-pipeline", "user_tier_set", "bob", "pro"},
	}
	cb, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.ConfigChanges)+" (event_id, at, action, actor, target, tier, detail, stream_seq, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	for i, ch := range changes {
		if err := cb.Append(fmt.Sprintf("config-%s-%d", ch.action, i+1), now.Add(-ch.age), ch.action, ch.actor, ch.target, ch.tier, "{}", uint64(i+1), now); err != nil {
			t.Fatal(err)
		}
	}
	if err := cb.Send(); err != nil {
		t.Fatal(err)
	}

	ledgerRows := ledgerFixture(t, ctx, c, db, l, now)

	total := int64(len(ds))
	for _, q := range []struct {
		query string
		want  uint64
	}{
		{"SELECT count() FROM " + db + ".decisions", uint64(total) + uint64(len(kinds)) + 3},
		{"SELECT count() FROM " + db + ".config_changes", uint64(len(changes)) + 3},
		{"SELECT count() FROM " + db + ".ledger", ledgerRows},
	} {
		poll.Until(t, 10*time.Second, "the fixture readable", func() error {
			got, err := count(ctx, read, q.query)
			if err == nil && got != q.want {
				err = fmt.Errorf("%s = %d, want %d", q.query, got, q.want)
			}
			return err
		})
	}
	checks := map[string]func(t *testing.T, s string, r result){
		"Usage per tier per hour": func(t *testing.T, s string, r result) {
			if got := r.sumInt(t, s, "total_requests"); got != total+reserves+ledgerChecks {
				t.Errorf("%s: requests add up to %d, want %d (settles and lease events are none)", s, got, total+reserves+ledgerChecks)
			}
			if got := r.sumInt(t, s, "denied"); got != denied {
				t.Errorf("%s: denied add up to %d, want the limits' %d (not the fail mode's %d)", s, got, denied, degradedDenied)
			}
			for _, c := range []struct {
				col  string
				want int64
			}{{"degraded", degraded}, {"fail_mode_denied", degradedDenied}} {
				if got := r.sumInt(t, s, c.col); got != c.want {
					t.Errorf("%s: %s adds up to %d, want %d", s, c.col, got, c.want)
				}
			}
		},
		"Top throttled subjects": func(t *testing.T, s string, r result) {
			if got := r.col(t, s, "subject_id")[0]; got != "bob" {
				t.Errorf("%s: first subject %v, want bob", s, got)
			}
			if got := toInt(t, r.col(t, s, "denied")[0]); got != 14 {
				t.Errorf("%s: bob denied %d times, want 14", s, got)
			}
			if got := r.sumInt(t, s, "denied"); got != denied {
				t.Errorf("%s: denied add up to %d, want the limits' %d (not the fail mode's %d)", s, got, denied, degradedDenied)
			}
			if slices.Contains(r.col(t, s, "subject_id"), any("*")) {
				t.Errorf("%s: lists the global subject, whom only a fail mode denied", s)
			}
		},
		"Denials by rule": func(t *testing.T, s string, r result) {
			if got := r.col(t, s, "rule_id")[0]; got != "pro-user-orders" {
				t.Errorf("%s: first rule %v, want pro-user-orders", s, got)
			}
			if got := r.sumInt(t, s, "denied"); got != denied {
				t.Errorf("%s: denied add up to %d, want the limits' %d (not the fail mode's %d)", s, got, denied, degradedDenied)
			}
			if got := r.sumInt(t, s, "fail_mode_denied"); got != degradedDenied {
				t.Errorf("%s: fail_mode_denied adds up to %d, want %d", s, got, degradedDenied)
			}
			// global-api's only denials are the fail mode's: listed, but not as throttling.
			i := slices.Index(r.col(t, s, "rule_id"), any("global-api"))
			if i < 0 {
				t.Fatalf("%s: no row of global-api, whose requests a fail mode denied", s)
			}
			if got := fmt.Sprint(r.col(t, s, "denied_share")[i], r.col(t, s, "fail_mode_share")[i]); got != "0 1" {
				t.Errorf("%s: global-api's denied_share and fail_mode_share %s, want 0 1", s, got)
			}
		},
		"Decisions answered by a fail mode": func(t *testing.T, s string, r result) {
			for _, c := range []struct {
				col  string
				want int64
			}{{"degraded", degraded}, {"fail_mode_denied", degradedDenied}, {"fail_mode_allowed", degraded - degradedDenied}} {
				if got := r.sumInt(t, s, c.col); got != c.want {
					t.Errorf("%s: %s adds up to %d, want %d", s, c.col, got, c.want)
				}
			}
			for i, rule := range r.col(t, s, "rule_id") {
				if share := r.col(t, s, "degraded_share")[i]; rule == "global-api" && share != 1.0 {
					t.Errorf("%s: global-api's degraded_share %v, want 1", s, share)
				}
			}
		},
		"Fail-mode answers by checker": func(t *testing.T, s string, r result) {
			var got []string
			for i, checker := range r.col(t, s, "checker_id") {
				got = append(got, fmt.Sprintf("%v %v %d %d", checker, r.col(t, s, "fail_mode")[i],
					toInt(t, r.col(t, s, "answers")[i]), toInt(t, r.col(t, s, "denied")[i])))
			}
			want := []string{"checker-c closed 20 20", "checker-c open 2 0"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %q, want %q", s, got, want)
			}
		},
		"Audit trail of a subject": func(t *testing.T, s string, r result) {
			if got := int64(len(r.Rows)); got != aliceRows {
				t.Errorf("%s: %d rows, want alice's %d", s, got, aliceRows)
			}
			times := r.col(t, s, "time")
			if !sort.SliceIsSorted(times, func(i, j int) bool { return times[i].(time.Time).Before(times[j].(time.Time)) }) {
				t.Errorf("%s: rows not in time order", s)
			}
		},
		"Shadow-mode would-be denials by rule": func(t *testing.T, s string, r result) {
			if got := r.sumInt(t, s, "would_deny"); got != shadowed {
				t.Errorf("%s: would-be denials add up to %d, want %d", s, got, shadowed)
			}
		},
		"Subjects a shadow rule would have denied": func(t *testing.T, s string, r result) {
			got := map[string]bool{}
			for _, v := range r.col(t, s, "subject_id") {
				got[v.(string)] = true
			}
			if !reflect.DeepEqual(got, shadowSubjects) {
				t.Errorf("%s: subjects %v, want %v", s, got, shadowSubjects)
			}
			if rules := r.col(t, s, "shadow_rules")[0]; !reflect.DeepEqual(rules, []string{"ip-strict-shadow"}) {
				t.Errorf("%s: first subject's shadow rules %v, want [ip-strict-shadow]", s, rules)
			}
			for i, id := range r.col(t, s, "subject_id") {
				if rules := r.col(t, s, "shadow_rules")[i]; id == "carol" && !reflect.DeepEqual(rules, []string{"pro-orders-shadow"}) {
					t.Errorf("%s: carol's shadow rules %v, want [pro-orders-shadow] (her candidate's denials are no shadow rule's)", s, rules)
				}
			}
		},
		"Candidate rules beside their live rules": func(t *testing.T, s string, r result) {
			// A row per day: the fixture's 45 minutes may span midnight.
			got := map[string]bool{}
			for i, c := range r.col(t, s, "candidate") {
				got[fmt.Sprintf("%v of %v", c, r.col(t, s, "live_rule")[i])] = true
			}
			want := map[string]bool{"free-user-search-candidate of free-user-search": true, "pro-user-orders-candidate of pro-user-orders": true}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: candidates %v, want %v", s, got, want)
			}
			// alice's 11 checks and carol's 2.
			for _, c := range []struct {
				col  string
				want int64
			}{{"checks", 13}, {"live_denied", 4}, {"candidate_denied", 7}, {"newly_denied", 4}, {"newly_allowed", 1}} {
				if got := r.sumInt(t, s, c.col); got != c.want {
					t.Errorf("%s: %s adds up to %d, want %d", s, c.col, got, c.want)
				}
			}
		},
		"Configuration changes in the last day": func(t *testing.T, s string, r result) {
			var got []string
			for i, actor := range r.col(t, s, "actor") {
				got = append(got, fmt.Sprintf("%v %v %v", actor, r.col(t, s, "action")[i], r.col(t, s, "target")[i]))
			}
			want := []string{"seed rules_seeded ", "alice-ops rule_replaced free-user-search", "ci-pipeline user_tier_set bob"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: changes %q, want %q (the last day's, oldest first)", s, got, want)
			}
		},
		"Endpoint usage per minute": func(t *testing.T, s string, r result) {
			if got := r.sumInt(t, s, "total_requests"); got != total+reserves+ledgerChecks {
				t.Errorf("%s: requests add up to %d, want %d", s, got, total+reserves+ledgerChecks)
			}
			if got, want := fmt.Sprint(r.sumInt(t, s, "denied"), r.sumInt(t, s, "degraded")), fmt.Sprint(denied, degraded); got != want {
				t.Errorf("%s: denied and degraded add up to %s, want %s", s, got, want)
			}
			// Each of the fixture's checks costs 1; the reservations cost what they settled.
			if got := r.sumInt(t, s, "cost"); got != total+1250+1500+300+ledgerCost {
				t.Errorf("%s: cost adds up to %d, want %d (reservations at their settled cost)", s, got, total+1250+1500+300+ledgerCost)
			}
		},
		"Reservations and leases per tier per day": func(t *testing.T, s string, r result) {
			for _, c := range []struct {
				col  string
				want int64
			}{{"reserved", 5300}, {"settled", 3050}, {"settle_count", 2}, {"overage_count", 1}, {"released", 1}} {
				if got := r.sumInt(t, s, c.col); got != c.want {
					t.Errorf("%s: %s adds up to %d, want %d", s, c.col, got, c.want)
				}
			}
		},
		"A balance recomputed from the ledger": func(t *testing.T, s string, r result) {
			// plan: 100 issued, 30 and 20 burned, 10 given back; promo: 50 issued, voided
			// unused; a rollover of 15 that expired yesterday.
			if got := toInt(t, r.col(t, s, "balance")[0]); got != 60 {
				t.Errorf("%s: erin's balance %d, want 60 (the plan's; the promo voided, the rollover expired)", s, got)
			}
		},
		"Entitlement usage per period": func(t *testing.T, s string, r result) {
			var got []string
			for i, sub := range r.col(t, s, "subject") {
				got = append(got, fmt.Sprintf("%v %d %d %d %d", sub, toInt(t, r.col(t, s, "granted")[i]), toInt(t, r.col(t, s, "used")[i]),
					toInt(t, r.col(t, s, "overage_used")[i]), toInt(t, r.col(t, s, "forfeited")[i])))
			}
			if want := []string{"erin 165 45 5 50"}; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %q, want %q (granted, used, overage, forfeited)", s, got, want)
			}
		},
		"Entitlement thresholds crossed": func(t *testing.T, s string, r result) {
			if got := fmt.Sprint(r.col(t, s, "kind"), r.col(t, s, "subject")); got != "[used_percent] [erin]" {
				t.Errorf("%s: %s, want erin's used_percent crossing", s, got)
			}
		},
		"Webhook deliveries that did not get through": func(t *testing.T, s string, r result) {
			if got := fmt.Sprint(r.col(t, s, "message_id"), r.col(t, s, "last_outcome")); got != "[evt-2] [gave up]" {
				t.Errorf("%s: %s, want evt-2 given up (evt-1 was delivered at its second attempt)", s, got)
			}
		},
		"Reservations: estimated and settled cost": func(t *testing.T, s string, r result) {
			var got []string
			for i, id := range r.col(t, s, "reservation_id") {
				got = append(got, fmt.Sprintf("%v %v %v %v %v", id, toInt(t, r.col(t, s, "estimated")[i]),
					toInt(t, r.col(t, s, "settled")[i]), toInt(t, r.col(t, s, "overage")[i]), toInt(t, r.col(t, s, "settles")[i])))
			}
			want := []string{"r1 4000 1250 0 1", "r2 1000 1500 1 1", "r3 300 300 0 0"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %q, want %q", s, got, want)
			}
		},
	}

	seen := map[string]bool{}
	for _, q := range queries {
		seen[q.section] = true
		// A subtest per query: a failing query or check does not hide the others.
		t.Run(q.section, func(t *testing.T) {
			sql := strings.ReplaceAll(q.sql, "quotaflow.", db+".")
			r, err := runQuery(ctx, read, sql)
			if err != nil {
				t.Fatalf("query %q: %v\n%s", q.section, err, sql)
			}
			if len(r.Rows) == 0 {
				t.Fatalf("query %q returned no rows\n%s", q.section, sql)
			}
			if check := checks[q.section]; check != nil {
				check(t, fmt.Sprintf("query %q", q.section), r)
			}
		})
	}
	for section := range checks {
		if !seen[section] {
			t.Errorf("docs/queries.md has no section %q", section)
		}
	}
}

// ledgerFixture stores erin's balance of llm-tokens as the pipeline would: two grants made and
// one voided (config events), checks that burned and a settle that gave back (the decisions'
// ledger entries), a rollover that expired; a threshold crossed; two webhook events, one
// delivered at its second attempt, one given up. It returns the ledger's rows (the views').
func ledgerFixture(t *testing.T, ctx context.Context, c driver.Conn, db string, l schema.Layout, now time.Time) uint64 {
	t.Helper()
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	cb, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.ConfigChanges)+" (event_id, at, action, actor, target, tier, detail, stream_seq, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	grant := func(id string, amount, forfeited int64) string {
		return fmt.Sprintf(`{"id":%q,"entitlement":"llm-tokens","dimension":"user","subject":"erin","amount":%d,"priority":1,"reason":"x \"subject\":\"eve\"","effective_ms":%d,"expires_ms":0,"period_start_s":%d,"period_end_s":%d,"forfeited":%d}`,
			id, amount, start.Add(-time.Hour).UnixMilli(), start.Unix(), end.Unix(), forfeited)
	}
	for i, g := range []struct{ action, id, detail string }{
		{"grant_issued", "plan", grant("plan", 100, 0)},
		{"grant_issued", "promo", grant("promo", 50, 0)},
		{"grant_voided", "promo", grant("promo", 50, 50)},
	} {
		// Two days ago: outside "Configuration changes in the last day".
		if err := cb.Append(fmt.Sprintf("config-%s-%s", g.action, g.id), now.Add(-48*time.Hour-time.Duration(3-i)*time.Minute), g.action, "ops", g.id, "", g.detail, uint64(100+i), now); err != nil {
			t.Fatal(err)
		}
	}
	if err := cb.Send(); err != nil {
		t.Fatal(err)
	}
	db2, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.Decisions)+" (id, checker_id, time, time_us, subject_dimension, subject_id, tier, endpoint, rule_id, cost, allowed, kind, "+
		"ledger.entitlement, ledger.dimension, ledger.subject, ledger.kind, ledger.grant_id, ledger.amount, ledger.period_start, ledger.period_end, partition, stream_seq, batch_id, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	yesterday := now.Add(-24 * time.Hour)
	type entry struct {
		kind, grant string
		amount      int64
	}
	// The third is the second recovered from the balance journal: the same decision id and
	// moves, published again after its checker was killed with the decision spooled but its
	// journal entry not yet dropped. The queries count its moves once.
	for i, d := range [][]entry{
		{{"rolled_over", "plan~1", 15}, {"burned", "plan", -30}, {"burned", "plan", -20}},
		{{"given_back", "plan", 10}, {"overage", "", -5}},
		{{"given_back", "plan", 10}, {"overage", "", -5}},
	} {
		n := len(d)
		ents, dims, subs, kinds, grants := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		amounts, starts, ends := make([]int64, n), make([]time.Time, n), make([]time.Time, n)
		for j, e := range d {
			ents[j], dims[j], subs[j], kinds[j], grants[j], amounts[j], starts[j], ends[j] = "llm-tokens", "user", "erin", e.kind, e.grant, e.amount, start, end
			if e.kind == "rolled_over" {
				ends[j] = yesterday.Truncate(time.Second) // a rollover that expired
			}
		}
		at := now.Add(-time.Duration(2-i) * time.Minute)
		id, kind, cost := fmt.Sprintf("ledger-%d", i), "", int64(50)
		if i == 2 {
			id, kind, cost = "ledger-1", "recovered", 0
		}
		if err := db2.Append(id, "checker-l", at, at.UnixMicro(), "user", "erin", "pro", "/v1/chat", "llm-tokens", cost, uint8(1), kind,
			ents, dims, subs, kinds, grants, amounts, starts, ends, uint16(6), uint64(i+1), "batch-l", now); err != nil {
			t.Fatal(err)
		}
	}
	if err := db2.Send(); err != nil {
		t.Fatal(err)
	}
	eb, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.EntitlementEvents)+
		" (event_id, at, kind, entitlement, dimension, subject, tier, threshold, grant_id, used, remaining, period_end, decision_id, stream_seq, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := eb.Append("ledger-0:llm-tokens:used_percent:50", now.Add(-time.Minute), "used_percent", "llm-tokens", "user", "erin", "pro",
		int64(50), "", int64(50), int64(60), end, "ledger-0", uint64(1), now); err != nil {
		t.Fatal(err)
	}
	if err := eb.Send(); err != nil {
		t.Fatal(err)
	}
	wb, err := c.PrepareBatch(ctx, "INSERT INTO "+db+"."+l.Storage(schema.WebhookDeliveries)+
		" (at, endpoint, message_id, attempt, status, outcome, error, duration_ms, next_ms)")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		age     time.Duration
		msg     string
		attempt uint32
		status  uint16
		outcome string
	}{{30 * time.Second, "evt-1", 1, 503, "retry"}, {20 * time.Second, "evt-1", 2, 200, "delivered"}, {10 * time.Second, "evt-2", 1, 0, "gave up"}} {
		if err := wb.Append(now.Add(-d.age), "billing", d.msg, d.attempt, d.status, d.outcome, "", uint32(5), uint64(0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Send(); err != nil {
		t.Fatal(err)
	}
	return 3 + 5 + 2 // the grants' events and the decisions' entries, the recovered copy's too
}
