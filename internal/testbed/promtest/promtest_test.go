package promtest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSelectors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		expr string
		want []Selector
	}{
		{`up`, []Selector{{Name: "up"}}},
		{`sum(rate(quotaflow_checks_total{degraded="false",result=~"denied|delayed"}[5m])) / sum(rate(quotaflow_checks_total[5m])) > 0.05`,
			[]Selector{{"quotaflow_checks_total", []string{"degraded", "result"}}, {Name: "quotaflow_checks_total"}}},
		{`histogram_quantile(0.99, sum by (le, instance) (rate(quotaflow_redis_duration_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`,
			[]Selector{{"quotaflow_redis_duration_seconds_bucket", []string{"instance"}}}},
		{`max by (tier) (a) > on (tier) group_left (x) max without (job) (b offset 1h30m) and bool c`,
			[]Selector{{Name: "a"}, {Name: "b"}, {Name: "c"}}},
		{`redis_memory_used_bytes / (redis_memory_max_bytes > 0) > 0.8`,
			[]Selector{{Name: "redis_memory_used_bytes"}, {Name: "redis_memory_max_bytes"}}},
		{`{__name__="quotaflow_publisher_queued", instance!="a"}`, []Selector{{"quotaflow_publisher_queued", []string{"__name__", "instance"}}}},
		{`sum(rate(x{a="}{by (", b!~'q'}[1m:10s])) # a comment naming y`, []Selector{{"x", []string{"a", "b"}}}},
		{`deriv(s[10m]) > 1e3 and s > 0x10`, []Selector{{Name: "s"}, {Name: "s"}}},
	} {
		got, err := Selectors(tt.expr)
		if err != nil {
			t.Errorf("Selectors(%q): %v", tt.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Selectors(%q) = %+v, want %+v", tt.expr, got, tt.want)
		}
	}
	for _, bad := range []string{`x{a="b"`, `x{a="b}`, `rate(x[5m)`, `{a="b"}`} {
		if got, err := Selectors(bad); err == nil {
			t.Errorf("Selectors(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestCatalogCheckExpr(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "metrics.txt")
	os.WriteFile(path, []byte("# families\nquotaflow_checks_total counter degraded result\nquotaflow_check_duration_seconds histogram result\nquotaflow_publisher_queued gauge\n"), 0o600)
	c, err := LoadCatalog(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		expr string
		want string // in the problems; "" for none
	}{
		{`sum by (result) (rate(quotaflow_checks_total{degraded="true",job="q"}[5m]))`, ""},
		{`histogram_quantile(0.5, sum by (le) (rate(quotaflow_check_duration_seconds_bucket{result="allowed",le!=""}[5m])))`, ""},
		{`rate(quotaflow_check_duration_seconds_sum[5m]) / rate(quotaflow_check_duration_seconds_count[5m])`, ""},
		{`quotaflow_publisher_queued{instance="a"}`, ""},
		{`rate(quotaflow_check_total[5m])`, "quotaflow_check_total: no such metric"},
		{`rate(quotaflow_checks_total{reslt="denied"}[5m])`, `no label "reslt"`},
		{`quotaflow_check_duration_seconds`, "quotaflow_check_duration_seconds: no such metric"},
		{`quotaflow_publisher_queued_bucket`, "no such metric"},
		{`quotaflow_publisher_queued{le="1"}`, `no label "le"`},
		{`vector(1)`, "selects no metric"},
	} {
		got := strings.Join(c.CheckExpr(tt.expr), "; ")
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("CheckExpr(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}
