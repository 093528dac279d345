// Package prometheus holds quotaflow's Prometheus alerting rules (alerts.yml) and their unit
// tests (alerts_test.yml); this test runs promtool on them and checks every metric they name
// against what quotaflow exports.
package prometheus

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/internal/testbed/promtest"
)

// TestPromtool: promtool finds alerts.yml valid and its unit tests (alerts_test.yml) pass.
func TestPromtool(t *testing.T) {
	t.Parallel()
	promtool := promtest.Promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type testFile struct {
	Tests []struct {
		Name        string `yaml:"name"`
		InputSeries []struct {
			Series string `yaml:"series"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			Alertname string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// readYAML decodes a file into v; strict refuses a field v lacks.
func readYAML(t *testing.T, path string, v any, strict bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(strict)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// catalog is what a Prometheus scraping quotaflow and redis_exporter holds.
func catalog(t *testing.T) promtest.Catalog {
	t.Helper()
	c, err := promtest.LoadCatalog("metrics.txt", "external-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// seriesRE is an input series of a promtool test: a name and its labels.
var seriesRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$`)
var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?:[^"\\]|\\.)*"`)

// TestAlerts: every alert selects only metrics quotaflow (metrics.txt) or redis_exporter
// (external-metrics.txt) export, with their labels; it has a severity, a summary and a
// description, and docs/operations.md names it; the unit tests feed only such series, and make
// each alert fire in one case and stay silent in another.
func TestAlerts(t *testing.T) {
	t.Parallel()
	c := catalog(t)
	var rules ruleFile
	readYAML(t, "alerts.yml", &rules, true)
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is no alert (%q): alerts.yml holds alerts only", g.Name, r.Record)
				continue
			}
			alerts = append(alerts, r.Alert)
			for _, e := range c.CheckExpr(r.Expr) {
				t.Errorf("alert %s: %s", r.Alert, e)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || len(r.Annotations["description"]) < 100 {
				t.Errorf("alert %s: want a summary and a description of what to do", r.Alert)
			}
			if !strings.Contains(string(ops), "`"+r.Alert+"`") {
				t.Errorf("alert %s: docs/operations.md does not name it", r.Alert)
			}
		}
	}
	if len(alerts) < 9 {
		t.Fatalf("alerts.yml has %d alerts, want the 9 or more of docs/operations.md", len(alerts))
	}

	var tests testFile
	readYAML(t, "alerts_test.yml", &tests, false) // promtool checks the rest
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			m := seriesRE.FindStringSubmatch(strings.TrimSpace(s.Series))
			if m == nil {
				t.Errorf("test %q: series %q unreadable", tc.Name, s.Series)
				continue
			}
			var labels []string
			for _, l := range labelRE.FindAllStringSubmatch(m[2], -1) {
				labels = append(labels, l[1])
			}
			for _, e := range c.CheckSeries(m[1], labels) {
				t.Errorf("test %q: series %s: %s", tc.Name, s.Series, e)
			}
		}
		for _, a := range tc.AlertRuleTest {
			if !slices.Contains(alerts, a.Alertname) {
				t.Errorf("test %q: no alert %s in alerts.yml", tc.Name, a.Alertname)
			}
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for _, a := range alerts {
		if !fires[a] || !silent[a] {
			t.Errorf("alert %s: alerts_test.yml has it firing: %v, silent: %v; want both", a, fires[a], silent[a])
		}
	}
}

// TestAlertsCatchMisspelledMetrics: a rule naming a metric that does not exist, or a label its
// metric lacks, fails TestAlerts' check, and its firing test fails in promtool.
func TestAlertsCatchMisspelledMetrics(t *testing.T) {
	t.Parallel()
	c := catalog(t)
	for _, expr := range []string{
		`sum(rate(quotaflow_check_total{degraded="true"}[2m])) > 0`,
		`sum(rate(quotaflow_checks_total{degradd="true"}[2m])) > 0`,
		`redis_memory_use_bytes / redis_memory_max_bytes > 0.8`,
	} {
		if errs := c.CheckExpr(expr); len(errs) == 0 {
			t.Errorf("CheckExpr(%q) found nothing wrong", expr)
		}
	}
	// The same misspelling in alerts.yml: promtool's unit test of the alert no longer fires.
	src, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	const good = `quotaflow_checks_total{degraded="true"}`
	if !strings.Contains(string(src), good) {
		t.Fatalf("alerts.yml has no %s", good)
	}
	dir := t.TempDir()
	bad := strings.Replace(string(src), good, `quotaflow_check_total{degraded="true"}`, 1)
	tests, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"alerts.yml": []byte(bad), "alerts_test.yml": tests} {
		if err := os.WriteFile(fmt.Sprintf("%s/%s", dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(promtest.Promtool(t), "test", "rules", "alerts_test.yml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "QuotaflowDecidingByFailMode") {
		t.Errorf("promtool test rules passed with a misspelled metric in QuotaflowDecidingByFailMode (err %v):\n%s", err, out)
	}
}
