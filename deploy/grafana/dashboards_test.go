// Package grafana holds quotaflow's Grafana dashboards (dashboards/) and their provisioning
// (provisioning/); this test checks the dashboards against Grafana's dashboard schema (the
// Go types of grafana-foundation-sdk, generated from it, decoding strictly), their data sources
// against the provisioning, their PromQL against promtool and what quotaflow exports, and runs
// their ClickHouse SQL on a real server with quotaflow's schema.
package grafana

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/testbed/promtest"
)

var chSrv *clickhousetest.Server

func TestMain(m *testing.M) {
	plugins.RegisterDefaultPlugins() // the panels' options and the queries of known data sources
	os.Exit(clickhousetest.Main(m, &chSrv))
}

// dashboardFiles are the provisioned dashboards.
func dashboardFiles(t *testing.T) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob("dashboards/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 2 {
		t.Fatalf("dashboards/ holds %v, want the metrics and the usage dashboards", paths)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = b
	}
	return out
}

// datasourceTypes are the provisioned data sources: uid → type.
func datasourceTypes(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("provisioning/datasources/*.yml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no provisioning/datasources/*.yml (%v)", err)
	}
	out := map[string]string{}
	for _, p := range paths {
		var f struct {
			APIVersion  int `yaml:"apiVersion"`
			Datasources []struct {
				Name, UID, Type, Access, URL string
				IsDefault                    bool           `yaml:"isDefault"`
				JSONData                     map[string]any `yaml:"jsonData"`
				SecureJSONData               map[string]any `yaml:"secureJsonData"`
			} `yaml:"datasources"`
		}
		decodeYAML(t, p, &f)
		for _, d := range f.Datasources {
			if d.UID == "" || d.Type == "" || d.Name == "" {
				t.Errorf("%s: data source %+v needs a name, a fixed uid and a type", p, d)
			}
			out[d.UID] = d.Type
		}
	}
	return out
}

func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestProvisioning: the dashboards provider is a file provider with a path, and each data source
// has a fixed uid.
func TestProvisioning(t *testing.T) {
	t.Parallel()
	var f struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name, Type, Folder    string
			OrgID                 int  `yaml:"orgId"`
			DisableDeletion       bool `yaml:"disableDeletion"`
			AllowUIUpdates        bool `yaml:"allowUiUpdates"`
			UpdateIntervalSeconds int  `yaml:"updateIntervalSeconds"`
			Options               struct {
				Path                      string `yaml:"path"`
				FoldersFromFilesStructure bool   `yaml:"foldersFromFilesStructure"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	decodeYAML(t, "provisioning/dashboards/quotaflow.yml", &f)
	if f.APIVersion != 1 || len(f.Providers) != 1 || f.Providers[0].Type != "file" || f.Providers[0].Options.Path == "" {
		t.Errorf("provisioning/dashboards/quotaflow.yml: %+v, want apiVersion 1 and one file provider with a path", f)
	}
	if ds := datasourceTypes(t); ds["quotaflow-prometheus"] != "prometheus" || ds["quotaflow-clickhouse"] != "grafana-clickhouse-datasource" {
		t.Errorf("provisioned data sources %v, want quotaflow-prometheus (prometheus) and quotaflow-clickhouse (grafana-clickhouse-datasource)", ds)
	}
}

// The JSON read to walk a dashboard: what the checks need of it.
type dashboardJSON struct {
	UID        string                 `json:"uid"`
	Title      string                 `json:"title"`
	Panels     []panelJSON            `json:"panels"`
	Links      []struct{ URL string } `json:"links"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panelJSON struct {
	ID         int               `json:"id"`
	Type       string            `json:"type"`
	Title      string            `json:"title"`
	Datasource *datasourceRef    `json:"datasource"`
	Targets    []json.RawMessage `json:"targets"`
	Panels     []panelJSON       `json:"panels"` // a collapsed row's
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// clickhouseQuery is a query of the grafana-clickhouse-datasource plugin written in SQL, as
// the plugin's editor saves it (src/types/sql.ts; format is its backend's: 0 time series, 1
// table): foundation-sdk has no type for it, so its fields are checked here.
type clickhouseQuery struct {
	RefID      string         `json:"refId"`
	Datasource *datasourceRef `json:"datasource"`
	EditorType string         `json:"editorType"`
	QueryType  string         `json:"queryType"`
	Format     *int           `json:"format"`
	RawSQL     string         `json:"rawSql"`
}

// decodeClickHouseQuery decodes a ClickHouse query strictly: encoding/json matches field names
// regardless of case and DisallowUnknownFields with them, so that rawSQL would pass for rawSql.
func decodeClickHouseQuery(raw []byte) (clickhouseQuery, error) {
	var cq clickhouseQuery
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return cq, err
	}
	known := map[string]bool{"refId": true, "datasource": true, "editorType": true, "queryType": true, "format": true, "rawSql": true}
	for k := range fields {
		if !known[k] {
			return cq, fmt.Errorf("unknown field %q", k)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return cq, dec.Decode(&cq)
}

// promQuery is what this test reads of a Prometheus query (its schema is foundation-sdk's).
type promQuery struct {
	RefID      string         `json:"refId"`
	Datasource *datasourceRef `json:"datasource"`
	Expr       string         `json:"expr"`
}

// dashboardQueries are a dashboard's queries found by checkDashboard.
type dashboardQueries struct {
	prom []string          // PromQL
	sql  map[string]string // panel title (or variable $name) → SQL
}

// checkDashboard returns what is wrong with a dashboard's JSON: anything Grafana's dashboard
// schema refuses (a field it does not know, a value of the wrong type, a required field
// missing), a panel type no panel plugin has, panel ids not unique, a data source the
// provisioning does not define (or of another type), a ClickHouse query not as the plugin
// saves it, a PromQL selector of a metric or label quotaflow does not export. It also returns
// the queries, for the tests that run them.
func checkDashboard(raw []byte, datasources map[string]string, catalog promtest.Catalog) ([]string, dashboardQueries) {
	var errs []string
	q := dashboardQueries{sql: map[string]string{}}
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict(raw); err != nil {
		// It returns an empty cog.BuildErrors, not nil, when all is well.
		if be, ok := err.(cog.BuildErrors); !ok || len(be) > 0 {
			errs = append(errs, "schema: "+strings.ReplaceAll(err.Error(), "\n", "; schema: "))
		}
	}
	if err := d.Validate(); err != nil {
		errs = append(errs, "schema validation: "+err.Error())
	}
	var dj dashboardJSON
	if err := json.Unmarshal(raw, &dj); err != nil {
		return append(errs, err.Error()), q
	}
	if dj.UID == "" || dj.Title == "" {
		errs = append(errs, "a dashboard needs a uid (its provisioned links use it) and a title")
	}
	checkDS := func(where string, ref *datasourceRef) string {
		if ref == nil {
			errs = append(errs, where+": no datasource")
			return ""
		}
		typ, ok := datasources[ref.UID]
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: datasource uid %q is not provisioned (provisioning/datasources)", where, ref.UID))
		} else if typ != ref.Type {
			errs = append(errs, fmt.Sprintf("%s: datasource %q is of type %s, not %s", where, ref.UID, typ, ref.Type))
		}
		return typ
	}
	for _, v := range dj.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := "variable " + v.Name
		var query string
		if err := json.Unmarshal(v.Query, &query); err != nil {
			errs = append(errs, where+": query is not a string")
		}
		switch checkDS(where, v.Datasource) {
		case "prometheus":
			inner := strings.TrimSuffix(strings.TrimPrefix(query, "label_values("), ")")
			metric, _, _ := strings.Cut(inner, ",")
			errs = append(errs, prefixed(where, catalog.CheckExpr(metric))...)
		case "grafana-clickhouse-datasource":
			q.sql["$"+v.Name] = query
		}
	}
	ids := map[int]string{}
	var walk func(ps []panelJSON)
	walk = func(ps []panelJSON) {
		for _, p := range ps {
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if other, ok := ids[p.ID]; ok || p.ID <= 0 {
				errs = append(errs, fmt.Sprintf("%s: id not unique (or not positive): %q has it too", where, other))
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if _, ok := cog.ConfigForPanelcfgVariant(p.Type); !ok {
				errs = append(errs, fmt.Sprintf("%s: no panel plugin %q", where, p.Type))
			}
			panelType := checkDS(where, p.Datasource)
			if len(p.Targets) == 0 {
				errs = append(errs, where+": no query")
			}
			for i, raw := range p.Targets {
				where := fmt.Sprintf("%s target %d", where, i)
				switch panelType {
				case "prometheus":
					var pq promQuery
					json.Unmarshal(raw, &pq) // its schema is checked above
					checkDS(where, pq.Datasource)
					errs = append(errs, prefixed(where, catalog.CheckExpr(pq.Expr))...)
					q.prom = append(q.prom, pq.Expr)
				case "grafana-clickhouse-datasource":
					cq, err := decodeClickHouseQuery(raw)
					if err != nil {
						errs = append(errs, fmt.Sprintf("%s: %v", where, err))
						continue
					}
					checkDS(where, cq.Datasource)
					wantFormat := map[string]int{"timeSeries": 0, "table": 1}
					if f, ok := wantFormat[cq.QueryType]; !ok || cq.Format == nil || *cq.Format != f || cq.EditorType != "sql" || cq.RefID == "" || cq.RawSQL == "" {
						errs = append(errs, fmt.Sprintf("%s: want refId, editorType sql, queryType timeSeries (format 0) or table (format 1) and rawSql", where))
					}
					q.sql[p.Title] = cq.RawSQL
				}
			}
		}
	}
	walk(dj.Panels)
	return errs, q
}

func prefixed(where string, errs []string) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = where + ": " + e
	}
	return out
}

func catalog(t *testing.T) promtest.Catalog {
	t.Helper()
	c, err := promtest.LoadCatalog("../prometheus/metrics.txt", "../prometheus/external-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDashboards: each dashboard passes checkDashboard; dashboard uids are unique and their
// links point at each other.
func TestDashboards(t *testing.T) {
	t.Parallel()
	ds, c := datasourceTypes(t), catalog(t)
	uids := map[string]bool{}
	var links []string
	for path, raw := range dashboardFiles(t) {
		errs, q := checkDashboard(raw, ds, c)
		for _, e := range errs {
			t.Errorf("%s: %s", path, e)
		}
		if len(q.prom)+len(q.sql) == 0 {
			t.Errorf("%s: no query", path)
		}
		var dj dashboardJSON
		json.Unmarshal(raw, &dj)
		if uids[dj.UID] {
			t.Errorf("%s: uid %q used twice", path, dj.UID)
		}
		uids[dj.UID] = true
		for _, l := range dj.Links {
			links = append(links, l.URL)
		}
	}
	for _, l := range links {
		if uid, ok := strings.CutPrefix(l, "/d/"); !ok || !uids[uid] {
			t.Errorf("link %q: want /d/<uid> of a provisioned dashboard", l)
		}
	}
}

// TestDashboardCheckCatchesMistakes: checkDashboard refuses a misspelled panel field, a value
// of the wrong type, a missing required field, an unknown panel type, an unprovisioned data
// source, a duplicate panel id, a misspelled metric or label, and a ClickHouse query with a
// field its plugin does not have.
func TestDashboardCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	ds, c := datasourceTypes(t), catalog(t)
	metrics, err := os.ReadFile("dashboards/quotaflow-metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	usage, err := os.ReadFile("dashboards/quotaflow-usage.json")
	if err != nil {
		t.Fatal(err)
	}
	if errs, _ := checkDashboard(metrics, ds, c); len(errs) > 0 {
		t.Fatalf("the metrics dashboard itself: %v", errs)
	}
	for _, tt := range []struct {
		name      string
		src       []byte
		old, new  string
		wantError string
	}{
		{"misspelled panel field", metrics, `"title": "Checks/s by outcome"`, `"titel": "Checks/s by outcome"`, "unexpected field 'titel'"},
		{"misspelled dashboard field", metrics, `"refresh": "30s"`, `"refresh": "30s", "refrsh": "1m"`, "unexpected field 'refrsh'"},
		{"misspelled option", metrics, `"displayMode": "list"`, `"displayMod": "list"`, "displayMode: required field is missing"},
		{"misspelled query field", metrics, `"legendFormat": "{{result}}"`, `"legendFormt": "{{result}}"`, "unexpected field 'legendFormt'"},
		{"wrong type", metrics, `"w": 12`, `"w": "12"`, "gridPos.w: json: cannot unmarshal string"},
		{"wrong type in the field config", metrics, `"fillOpacity": 10`, `"fillOpacity": "10"`, "custom.fillOpacity"},
		{"required field missing", metrics, `"schemaVersion": 39,`, ``, "schemaVersion"},
		{"unknown panel type", metrics, `"type": "timeseries"`, `"type": "timeserie"`, `no panel plugin "timeserie"`},
		{"unprovisioned data source", metrics, `"uid": "quotaflow-prometheus"`, `"uid": "prometheus"`, `uid "prometheus" is not provisioned`},
		{"duplicate panel id", metrics, `"id": 3,`, `"id": 2,`, "id not unique"},
		{"misspelled metric", metrics, `quotaflow_publisher_spool_bytes{`, `quotaflow_publisher_spool_byte{`, "quotaflow_publisher_spool_byte: no such metric"},
		{"misspelled label", metrics, `quotaflow_checks_total{degraded=`, `quotaflow_checks_total{degradd=`, `no label "degradd"`},
		{"histogram without its suffix", metrics, `quotaflow_check_duration_seconds_bucket{`, `quotaflow_check_duration_seconds{`, "quotaflow_check_duration_seconds: no such metric"},
		{"ClickHouse query field", usage, `"rawSql":`, `"rawSQL":`, `unknown field "rawSQL"`},
		{"ClickHouse query format", usage, `"format": 1`, `"format": 0`, "format 1"},
	} {
		if !bytes.Contains(tt.src, []byte(tt.old)) {
			t.Errorf("%s: the dashboard has no %s", tt.name, tt.old)
			continue
		}
		bad := bytes.Replace(tt.src, []byte(tt.old), []byte(tt.new), 1)
		errs, _ := checkDashboard(bad, ds, c)
		if !strings.Contains(strings.Join(errs, "\n"), tt.wantError) {
			t.Errorf("%s: errors %q, want one with %q", tt.name, errs, tt.wantError)
		}
	}
}

// TestPromQL: promtool parses every Prometheus query of the dashboards (as recording rules,
// Grafana's variables replaced by values).
func TestPromQL(t *testing.T) {
	t.Parallel()
	ds, c := datasourceTypes(t), catalog(t)
	var exprs []string
	for _, raw := range dashboardFiles(t) {
		_, q := checkDashboard(raw, ds, c)
		exprs = append(exprs, q.prom...)
	}
	r := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h", "$instance", ".*")
	type recording struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []recording
	for i, e := range exprs {
		e = r.Replace(e)
		if strings.Contains(e, "$") {
			t.Errorf("query %q: a variable this test does not replace", e)
		}
		rules = append(rules, recording{fmt.Sprintf("dashboard:query_%d", i), e})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboards", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboards.yml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	promtool := promtest.Promtool(t)
	out, err := runCommand(promtool, "check", "rules", path)
	if err != nil || !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", len(rules))) {
		t.Errorf("promtool check rules of the dashboards' queries: %v\n%s", err, out)
	}
	// promtool must refuse a broken query for this test to mean anything.
	bad := strings.Replace(string(b), "sum by (result)", "sum by result", 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCommand(promtool, "check", "rules", path); err == nil {
		t.Errorf("promtool check rules accepted `sum by result`:\n%s", out)
	}
	if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, "sum by (result)") }) {
		t.Error("no query with `sum by (result)` to break")
	}
}
