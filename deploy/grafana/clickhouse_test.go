package grafana

import (
	"context"
	"fmt"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/schema"
)

// grafanaSQL expands what Grafana and the grafana-clickhouse-datasource plugin expand in a
// query before sending it, as they do (the plugin's pkg/macros): the time range from..to, an
// interval of intervalS seconds, the dashboard's variables (${name}, ${name:singlequote}).
func grafanaSQL(sql string, from, to time.Time, intervalS int, vars map[string][]string) string {
	dt := func(t time.Time) string { return fmt.Sprintf("toDateTime(%d)", t.Unix()) }
	d := func(t time.Time) string { return fmt.Sprintf("toDate('%s')", t.UTC().Format("2006-01-02")) }
	sql = regexp.MustCompile(`\$__timeFilter\(([^)]+)\)`).ReplaceAllStringFunc(sql, func(m string) string {
		col := strings.TrimSpace(m[len("$__timeFilter(") : len(m)-1])
		return fmt.Sprintf("%s >= %s AND %s <= %s", col, dt(from), col, dt(to))
	})
	sql = regexp.MustCompile(`\$__dateFilter\(([^)]+)\)`).ReplaceAllStringFunc(sql, func(m string) string {
		col := strings.TrimSpace(m[len("$__dateFilter(") : len(m)-1])
		return fmt.Sprintf("%s >= %s AND %s <= %s", col, d(from), col, d(to))
	})
	r := []string{"$__fromTime", dt(from), "$__toTime", dt(to), "$__interval_s", fmt.Sprint(intervalS)}
	for name, vs := range vars {
		quoted := make([]string, len(vs))
		for i, v := range vs {
			quoted[i] = "'" + strings.ReplaceAll(v, "'", `\'`) + "'"
		}
		r = append(r, "${"+name+":singlequote}", strings.Join(quoted, ","), "${"+name+"}", strings.Join(vs, ","))
	}
	return strings.NewReplacer(r...).Replace(sql)
}

// fixtureDecision is a row of the usage dashboard's fixture.
type fixtureDecision struct {
	n                                int
	tier, dim, subject, rule, kind   string
	allowed, shadow, degraded, delay bool
}

// The fixture: tier free's alice is denied 6 times by free-minute and bob once, and 6 of bob's
// checks are decided by fail mode while Redis is down (4 denied by the closed global-api);
// tier pro's carol trips a shadow rule twice. 35 checks, 28 of them free's; a settle is no check.
var fixture = []fixtureDecision{
	{n: 10, tier: "free", dim: "user", subject: "alice", rule: "free-minute", allowed: true},
	{n: 2, tier: "free", dim: "user", subject: "alice", rule: "free-minute", allowed: true, delay: true},
	{n: 6, tier: "free", dim: "user", subject: "alice", rule: "free-minute"},
	{n: 3, tier: "free", dim: "user", subject: "bob", rule: "free-minute", allowed: true},
	{n: 1, tier: "free", dim: "user", subject: "bob", rule: "free-minute"},
	{n: 4, tier: "free", dim: "user", subject: "bob", rule: "global-api", degraded: true},
	{n: 2, tier: "free", dim: "user", subject: "bob", rule: "global-api", allowed: true, degraded: true},
	{n: 5, tier: "pro", dim: "user", subject: "carol", rule: "pro-minute", allowed: true},
	{n: 2, tier: "pro", dim: "user", subject: "carol", rule: "pro-minute", allowed: true, shadow: true},
	{n: 1, tier: "pro", dim: "user", subject: "carol", rule: "pro-minute", allowed: true, kind: "settle"},
}

// TestClickHouseQueries runs every ClickHouse query of the dashboards, its macros and variables
// expanded as Grafana does, on Debian's ClickHouse with quotaflow's schema (schema/migrations)
// over the fixture, and checks what the main panels show. Queries of the rollups' degraded
// columns (migration 0011) are run when the schema has them.
func TestClickHouseQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	db := fmt.Sprintf("grafana_test_%d", os.Getpid())
	if err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, _, err := schema.Migrate(mctx, c, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db) })

	b, err := c.PrepareBatch(ctx, "INSERT INTO "+db+".decisions (id, checker_id, time, time_us, subject_dimension, subject_id, tier, endpoint, rule_id, cost, allowed, shadow, degraded, kind, delay_us, partition, stream_seq, batch_id, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	seq := 0
	for _, f := range fixture {
		for range f.n {
			seq++
			at := now.Add(-time.Duration(seq) * time.Minute) // the last 40 minutes, one a minute
			delay := int64(0)
			if f.delay {
				delay = 250000
			}
			if err := b.Append(fmt.Sprintf("grafana-%d", seq), "checker-a", at, at.UnixMicro(), f.dim, f.subject, f.tier, "/api/items", f.rule,
				int64(1), u8(f.allowed), u8(f.shadow), u8(f.degraded), f.kind, delay, uint16(0), uint64(seq), "batch-1", now); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	var degradedColumns uint64
	if err := c.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = 'usage_minute' AND name IN ('degraded_requests', 'degraded_denied')", db).Scan(&degradedColumns); err != nil {
		t.Fatal(err)
	}

	ds, cat := datasourceTypes(t), catalog(t)
	from, to := now.Add(-2*time.Hour), now.Add(time.Minute)
	vars := map[string][]string{"database": {db}, "tier": {"free", "pro"}}
	results := map[string]result{}
	ran := 0
	for path, raw := range dashboardFiles(t) {
		_, q := checkDashboard(raw, ds, cat)
		for title, sql := range q.sql {
			sql = grafanaSQL(sql, from, to, 60, vars)
			if strings.Contains(sql, "$") {
				t.Errorf("%s: %s: a macro or variable this test does not expand:\n%s", path, title, sql)
				continue
			}
			if strings.Contains(sql, "degraded_") && degradedColumns < 2 {
				t.Logf("%s: %s: not run: the rollups have no degraded_requests and degraded_denied (migration 0011) yet", path, title)
				continue
			}
			r, err := runQuery(ctx, c, sql)
			if err != nil {
				t.Errorf("%s: %s: %v\n%s", path, title, err, sql)
				continue
			}
			if len(r.Rows) == 0 {
				t.Errorf("%s: %s: no row over the fixture\n%s", path, title, sql)
			}
			results[title] = r
			ran++
		}
	}
	if ran < 6 {
		t.Errorf("ran %d ClickHouse queries, want at least 6", ran)
	}

	// What the panels show of the fixture.
	if r, ok := results["$tier"]; ok && !reflect.DeepEqual(r.col(t, "tier"), []any{"free", "pro"}) {
		t.Errorf("$tier: %v, want free and pro", r.col(t, "tier"))
	}
	if r, ok := results["Checks/s per tier"]; ok {
		if got := r.sumWhere(t, "checks_per_second", "tier", "free") * 60; math.Abs(got-28) > 1e-9 {
			t.Errorf("Checks/s per tier: free's checks add up to %v, want 28 (a settle is no check)", got)
		}
	}
	if r, ok := results["Top throttled subjects"]; ok {
		if s, n := r.col(t, "subject_id")[0], toFloat(t, r.col(t, "denied_by_limits")[0]); s != "alice" || n != 6 {
			t.Errorf("Top throttled subjects: first %v with %v denials, want alice with 6", s, n)
		}
		if got := r.sumWhere(t, "denied_by_limits", "subject_id", "bob"); got != 1 {
			t.Errorf("Top throttled subjects: bob denied %v times by limits, want 1 (his 4 fail-mode denials are none)", got)
		}
	}
	if r, ok := results["Top subjects"]; ok {
		if s, n := r.col(t, "subject_id")[0], toFloat(t, r.col(t, "checks")[0]); s != "alice" || n != 18 {
			t.Errorf("Top subjects: first %v with %v checks, want alice with 18", s, n)
		}
	}
	if r, ok := results["Daily checks per tier"]; ok {
		if got := r.sum(t, "checks"); got != 35 {
			t.Errorf("Daily checks per tier: %v checks, want 35", got)
		}
	}
	if r, ok := results["Checks/s by rule"]; ok {
		rules := map[any]bool{}
		for _, v := range r.col(t, "rule_id") {
			rules[v] = true
		}
		if len(rules) != 3 {
			t.Errorf("Checks/s by rule: rules %v, want free-minute, global-api and pro-minute", rules)
		}
	}
	if degradedColumns < 2 {
		return
	}
	if r, ok := results["Usage per tier"]; ok {
		for col, want := range map[string]float64{"checks": 28, "allowed": 17, "delayed": 2, "denied_by_limits": 7, "fail_mode": 6, "fail_mode_denied": 4} {
			if got := r.sumWhere(t, col, "tier", "free"); got != want {
				t.Errorf("Usage per tier: free's %s = %v, want %v", col, got, want)
			}
		}
		if got := r.sumWhere(t, "shadow_denied", "tier", "pro"); got != 2 {
			t.Errorf("Usage per tier: pro's shadow_denied = %v, want 2", got)
		}
	}
	if r, ok := results["Outcomes"]; ok {
		for col, want := range map[string]float64{"allowed": 24, "delayed": 2, "denied_by_limits": 7, "fail_mode": 6} {
			if got := r.sum(t, col) * 60; math.Abs(got-want) > 1e-9 {
				t.Errorf("Outcomes: %s adds up to %v checks, want %v", col, got, want)
			}
		}
	}
	if r, ok := results["Denials by rule"]; ok {
		if got := r.sumWhere(t, "denied_by_limits", "rule_id", "global-api"); got != 0 {
			t.Errorf("Denials by rule: global-api denied %v by limits, want 0 (its denials were by fail mode)", got)
		}
		if got := r.sumWhere(t, "denied_by_limits", "rule_id", "free-minute"); got != 7 {
			t.Errorf("Denials by rule: free-minute denied %v, want 7", got)
		}
	}
	if r, ok := results["Denial ratio per tier"]; ok {
		for _, v := range r.col(t, "denial_ratio") {
			if got := toFloat(t, v); got < 0 || got > 1 {
				t.Errorf("Denial ratio per tier: %v, want 0 to 1", got)
			}
		}
	}
}

func u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// result is a query's rows, read through the column types.
type result struct{ clickhousetest.Answer }

func runQuery(ctx context.Context, c driver.Conn, q string) (result, error) {
	r, err := clickhousetest.Query(ctx, c, q)
	return result{r}, err
}

func (r result) col(t *testing.T, name string) []any {
	t.Helper()
	i := slices.Index(r.Cols, name)
	if i < 0 {
		t.Fatalf("no column %q in %v", name, r.Cols)
	}
	vs := make([]any, len(r.Rows))
	for j, row := range r.Rows {
		vs[j] = row[i]
	}
	return vs
}

func (r result) sum(t *testing.T, name string) float64 {
	t.Helper()
	var s float64
	for _, v := range r.col(t, name) {
		s += toFloat(t, v)
	}
	return s
}

// sumWhere adds up column name over the rows whose column key is value.
func (r result) sumWhere(t *testing.T, name, key string, value any) float64 {
	t.Helper()
	keys, vals := r.col(t, key), r.col(t, name)
	var s float64
	for i := range keys {
		if keys[i] == value {
			s += toFloat(t, vals[i])
		}
	}
	return s
}

func toFloat(t *testing.T, v any) float64 {
	t.Helper()
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return float64(rv.Uint())
	case reflect.Float32, reflect.Float64:
		return rv.Float()
	}
	t.Fatalf("%v (%T) is not a number", v, v)
	return 0
}
