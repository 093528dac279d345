package schema_test

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/schema"
)

var update = flag.Bool("update", false, "rewrite the cluster renderings in testdata/cluster-*.sql")

// render is every migration for database quotaflow in a dialect and layout, as Migrate would
// run it: the statements, each ended by ";" and a blank line.
func render(t *testing.T, modern bool, l schema.Layout) string {
	t.Helper()
	ms, err := schema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, m := range ms {
		stmts, err := m.Render("quotaflow", schema.Dialect{Modern: modern}, l)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stmts {
			b.WriteString(s + ";\n\n")
		}
	}
	return b.String()
}

func dialectName(modern bool) string {
	if modern {
		return "modern"
	}
	return "legacy"
}

// TestRenderSingleServerUnchanged: the default layout renders, statement for statement, what
// it rendered before the cluster layout existed, then what later migrations add (testdata/single-*.sql, written by the code
// of that time and never regenerated), so that a new single server gets the same schema as
// every existing one.
func TestRenderSingleServerUnchanged(t *testing.T) {
	t.Parallel()
	for _, modern := range []bool{false, true} {
		t.Run(dialectName(modern), func(t *testing.T) {
			want, err := os.ReadFile("testdata/single-" + dialectName(modern) + ".sql")
			if err != nil {
				t.Fatal(err)
			}
			// Later migrations add to it; none changes what it renders.
			if got := render(t, modern, schema.Layout{}); !strings.HasPrefix(got, string(want)) {
				t.Errorf("single-server rendering changed:\n%s\nwant it to start with:\n%s", got, want)
			}
			// Statements is the single-server Render.
			ms, _ := schema.Migrations()
			a, errA := ms[0].Statements("quotaflow", schema.Dialect{Modern: modern})
			b, errB := ms[0].Render("quotaflow", schema.Dialect{Modern: modern}, schema.OnCluster(""))
			if errA != nil || errB != nil || strings.Join(a, ";") != strings.Join(b, ";") {
				t.Errorf("Statements = %q, %v; OnCluster(\"\") Render = %q, %v; want the same", a, errA, b, errB)
			}
		})
	}
}

// TestRenderCluster checks the replicated rendering of both dialects, the modern one being
// the only test a current server's SQL gets here: every table holding rows is a Replicated
// engine named *_local with the {shard}/{replica} macros, every statement runs ON CLUSTER,
// every table has its Distributed table under its usual name, and the views read and fill the
// local tables. The whole text is kept in testdata/cluster-*.sql for review (go test -update).
func TestRenderCluster(t *testing.T) {
	t.Parallel()
	tables := []schema.Table{schema.Decisions, schema.IngestedMessages, schema.UsageMinute, schema.UsageHour,
		schema.UsageDay, schema.StateTransitions, schema.Overrides, schema.ConfigChanges}
	for _, modern := range []bool{false, true} {
		t.Run(dialectName(modern), func(t *testing.T) {
			sql := render(t, modern, schema.OnCluster("qf"))
			golden := "testdata/cluster-" + dialectName(modern) + ".sql"
			if *update {
				if err := os.WriteFile(golden, []byte(sql), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if want, err := os.ReadFile(golden); err != nil || sql != string(want) {
				t.Errorf("rendering differs from %s (%v); review it with go test -update and git diff", golden, err)
			}
			stmts := strings.Split(strings.TrimSuffix(sql, ";\n\n"), ";\n\n")
			for _, s := range stmts {
				if !strings.Contains(strings.SplitN(s, "\n", 2)[0], " ON CLUSTER 'qf'") {
					t.Errorf("statement does not run ON CLUSTER 'qf':\n%s", s)
				}
			}
			for _, tb := range tables {
				local := "quotaflow." + string(tb) + "_local"
				for _, want := range []string{
					"CREATE TABLE IF NOT EXISTS " + local + " ON CLUSTER 'qf' (",
					"MergeTree('/clickhouse/tables/{shard}/quotaflow/" + string(tb) + "_local', '{replica}')",
					"CREATE TABLE IF NOT EXISTS quotaflow." + string(tb) + " ON CLUSTER 'qf' AS " + local +
						"\nENGINE = Distributed('qf', 'quotaflow', '" + string(tb) + "_local', rand())",
				} {
					if !strings.Contains(sql, want) {
						t.Errorf("%s: no %q", tb, want)
					}
				}
			}
			for _, bad := range []*regexp.Regexp{
				// a table that would not replicate
				regexp.MustCompile(`ENGINE = (Summing)?MergeTree\b`),
				// a view reading or filling a Distributed table
				regexp.MustCompile(`(FROM|TO) quotaflow\.(decisions|usage_minute|usage_hour|usage_day|ingested_messages)\b`),
				regexp.MustCompile(`non_replicated_deduplication_window`),
			} {
				if m := bad.FindString(sql); m != "" {
					t.Errorf("cluster rendering holds %q", m)
				}
			}
			for _, feature := range []string{"TTL toDateTime(time) + INTERVAL 90 DAY", "LowCardinality(String)",
				"SETTINGS ttl_only_drop_parts = 1, replicated_deduplication_window = 1000"} {
				if got := strings.Contains(sql, feature); got != modern {
					t.Errorf("SQL contains %q = %v, want %v", feature, got, modern)
				}
			}
			for _, view := range []string{"ingested_messages_mv", "usage_minute_mv", "usage_hour_mv", "usage_day_mv"} {
				if !regexp.MustCompile(`(?s)VIEW IF NOT EXISTS quotaflow\.` + view + ` ON CLUSTER 'qf' TO quotaflow\.\w+_local AS.*?FROM quotaflow\.decisions_local`).MatchString(sql) {
					t.Errorf("%s does not turn decisions_local into a local table", view)
				}
			}
		})
	}
}

func TestRenderBadCluster(t *testing.T) {
	t.Parallel()
	ms, _ := schema.Migrations()
	for _, name := range []string{"qf'; DROP", "a b", "-x"} {
		if _, err := ms[0].Render("quotaflow", schema.Dialect{}, schema.OnCluster(name)); err == nil {
			t.Errorf("Render on cluster %q succeeded, want an error", name)
		}
	}
}

func TestLayoutStorage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		layout schema.Layout
		table  schema.Table
		want   string
	}{
		{schema.Layout{}, schema.Decisions, "decisions"},
		{schema.OnCluster(""), schema.StateTransitions, "state_transitions"},
		{schema.OnCluster("qf"), schema.Decisions, "decisions_local"},
		{schema.OnCluster("qf"), schema.ConfigChanges, "config_changes_local"},
	} {
		if got := tt.layout.Storage(tt.table); got != tt.want {
			t.Errorf("%v.Storage(%s) = %q, want %q", tt.layout, tt.table, got, tt.want)
		}
	}
}
