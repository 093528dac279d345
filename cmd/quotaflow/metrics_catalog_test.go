package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/telemetry"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// metricsCatalog lists the metric families quotaflow exports; deploy/prometheus's and
// deploy/grafana's tests check every name their alerts and panels use against it.
const metricsCatalog = "../../deploy/prometheus/metrics.txt"

var updateCatalog = flag.Bool("update-metrics", false, "rewrite "+metricsCatalog+" from the metrics a checker and an aggregator export")

// TestMetricsCatalog runs a checker with its publisher and an aggregator (with a tier
// protection policy, whose leader reports the tier gauges) in one process, as `quotaflow serve`
// does, and compares the quotaflow_* families of its /metrics, named by the real Prometheus
// exporter, with deploy/prometheus/metrics.txt. Every synchronous instrument gets a 0 added or
// recorded when it is made (everyInstrument), so that the scrape shows the families of events
// that did not happen (a ClickHouse error, a shed check). Run with -update-metrics to rewrite
// the file after adding or renaming a metric.
func TestMetricsCatalog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns, err := natstest.Start() // of its own: the stream, the consumers and the buckets have fixed names
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Close)
	tel, err := telemetry.Setup(ctx, telemetry.Config{Instance: "catalog"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.CloseTelemetry(tel) })
	tel.Meter = everyInstrument{tel.Meter}
	daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: ns.URL, ClickHouseDSN: chSrv.DSN(databaseName("catalog")), Telemetry: tel,
		Aggregator: aggregator.Config{PolicyInterval: 100 * time.Millisecond, FlushInterval: 100 * time.Millisecond}})
	p := startChecker(t, "catalog", ns.URL, t.TempDir(), func(c *daemon.CheckerConfig) {
		c.Telemetry, c.RulesFile = tel, "../../deploy/dev/rules.yaml" // tier_protection of tier free
	})
	// A free user's 12 checks on /api/items: user-api-minute (10 a minute) allows 10 and denies
	// 2, the second from the over-limit cache; the user goes to warning, then throttled.
	user := fmt.Sprintf("catalog-%d", time.Now().UnixNano())
	for range 12 {
		if _, err := p.client.CheckRateLimit(ctx, userCheck(user)); err != nil {
			t.Fatal(err)
		}
	}
	var families map[string]*family
	deadline := time.Now().Add(60 * time.Second)
	for {
		families = metricFamilies(scrape(t, p.url+"/metrics"))
		// Every family and label is there once the leader evaluated the tier protection and
		// the aggregator published and stored the warning transitions.
		labeled := func(name, label string) bool { f := families[name]; return f != nil && f.labels[label] }
		if labeled("quotaflow_aggregator_warning_transitions_total", "to") && labeled("quotaflow_aggregator_events_stored_total", "kind") &&
			labeled("quotaflow_aggregator_tier_allowed", "tier") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var got []string
	for name, f := range families {
		if strings.HasPrefix(name, "quotaflow_") {
			got = append(got, f.String())
		}
	}
	slices.Sort(got)
	if *updateCatalog {
		header := "# The metric families quotaflow's checkers (with their publishers) and aggregators export on\n" +
			"# /metrics, as the Prometheus exporter names them: name, type, then labels (a histogram's le\n" +
			"# left out; Prometheus adds job and instance when it scrapes). Written by TestMetricsCatalog\n" +
			"# (cmd/quotaflow: go test ./cmd/quotaflow -run TestMetricsCatalog -update-metrics), which fails\n" +
			"# when this list and a real scrape differ; the alerts' and dashboards' tests check their names here.\n"
		if err := os.WriteFile(metricsCatalog, []byte(header+strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := readCatalog(metricsCatalog)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			t.Errorf("/metrics exports %q, which %s lacks (run this test with -update-metrics)", l, metricsCatalog)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			t.Errorf("%s lists %q, which /metrics does not export (run this test with -update-metrics)", metricsCatalog, l)
		}
	}
}

// family is a metric family of an exposition: its name, type and the labels of its samples
// (le of a histogram's buckets left out).
type family struct {
	name, typ string
	labels    map[string]bool
}

// String is the family's line in the catalog: name, type, then its labels in order.
func (f *family) String() string {
	ls := []string{f.name, f.typ}
	for l := range f.labels {
		ls = append(ls, l)
	}
	slices.Sort(ls[2:])
	return strings.Join(ls, " ")
}

var sampleLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// metricFamilies returns the families of a Prometheus text exposition by name.
func metricFamilies(exposition string) map[string]*family {
	out := map[string]*family{}
	for _, l := range strings.Split(exposition, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = &family{name: f[2], typ: f[3], labels: map[string]bool{}}
			continue
		}
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name, rest, _ := strings.Cut(l, "{")
		name = strings.Fields(name)[0]
		fam := out[name]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); fam == nil && ok {
				fam = out[base]
			}
		}
		if fam == nil || !strings.Contains(l, "{") {
			continue
		}
		labels, _, _ := strings.Cut(rest, "} ")
		for _, m := range sampleLabel.FindAllStringSubmatch(labels, -1) {
			if m[1] != "le" {
				fam.labels[m[1]] = true
			}
		}
	}
	return out
}

// readCatalog returns the lines of the catalog, comments left out.
func readCatalog(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			if len(strings.Fields(l)) < 2 {
				return nil, fmt.Errorf("%s: %q: want name, type and labels", path, l)
			}
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// everyInstrument is a meter whose synchronous instruments get a 0 added or recorded as they
// are made, without attributes: their families show on /metrics before anything happened.
type everyInstrument struct{ metric.Meter }

func (m everyInstrument) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	i, err := m.Meter.Int64Counter(name, opts...)
	if err == nil {
		i.Add(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Float64Counter(name string, opts ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	i, err := m.Meter.Float64Counter(name, opts...)
	if err == nil {
		i.Add(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Int64UpDownCounter(name string, opts ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	i, err := m.Meter.Int64UpDownCounter(name, opts...)
	if err == nil {
		i.Add(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Float64UpDownCounter(name string, opts ...metric.Float64UpDownCounterOption) (metric.Float64UpDownCounter, error) {
	i, err := m.Meter.Float64UpDownCounter(name, opts...)
	if err == nil {
		i.Add(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Int64Histogram(name string, opts ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	i, err := m.Meter.Int64Histogram(name, opts...)
	if err == nil {
		i.Record(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	i, err := m.Meter.Float64Histogram(name, opts...)
	if err == nil {
		i.Record(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Int64Gauge(name string, opts ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	i, err := m.Meter.Int64Gauge(name, opts...)
	if err == nil {
		i.Record(context.Background(), 0)
	}
	return i, err
}

func (m everyInstrument) Float64Gauge(name string, opts ...metric.Float64GaugeOption) (metric.Float64Gauge, error) {
	i, err := m.Meter.Float64Gauge(name, opts...)
	if err == nil {
		i.Record(context.Background(), 0)
	}
	return i, err
}
