package audit_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/schema"
)

var chSrv *clickhousetest.Server

func TestMain(m *testing.M) { os.Exit(clickhousetest.Main(m, &chSrv)) }

// row is one recorded check of the fixture.
type row struct {
	at                time.Time
	subject, tier     string
	rule              string
	cost              int64
	allowed, degraded bool
	delayUS           int64
}

// fixture migrates a database of its own and records rows in it, through the audit table
// the aggregators write, so that the rollups' views count them too.
func fixture(t *testing.T, name string, rows []row) (*audit.Reader, driver.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	db := "audit_" + name
	if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (schema.Layout{}).Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".decisions (id, time, time_us, subject_dimension, subject_id, subjects, tier, endpoint, rule_id, cost, allowed, degraded, limit_value, remaining, delay_us, ingested_at)")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		dim, id, _ := strings.Cut(r.subject, ":")
		if err := b.Append(name+"-"+strconv.Itoa(i), r.at, r.at.UnixMicro(), dim, id, []string{r.subject}, r.tier, "/v1/items", r.rule, r.cost,
			b2u(r.allowed), b2u(r.degraded), int64(10), int64(0), r.delayUS, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	rd, err := audit.New(audit.Config{Conn: conn, Database: db})
	if err != nil {
		t.Fatal(err)
	}
	return rd, conn
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// TestSeriesAndTop: the last hour per tier and per rule from the minute rollup, and the
// subjects denied most, with a fail mode's answers counted apart from the limits' denials.
func TestSeriesAndTop(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	at := now.Add(-10 * time.Minute)
	var rows []row
	add := func(n int, r row) {
		for range n {
			r.at = at
			rows = append(rows, r)
			at = at.Add(time.Second)
		}
	}
	add(6, row{subject: "user:alice", tier: "free", rule: "free-api", cost: 1, allowed: true})
	add(4, row{subject: "user:alice", tier: "free", rule: "free-api", cost: 1})
	add(2, row{subject: "user:alice", tier: "free", rule: "free-api", cost: 1, allowed: true, delayUS: 20_000})
	add(3, row{subject: "user:bob", tier: "pro", rule: "pro-api", cost: 2, allowed: true})
	add(7, row{subject: "user:bob", tier: "pro", rule: "pro-api", cost: 1})
	// Redis unreachable: carol's checks answered by the fail mode, 5 denied, 1 allowed.
	add(5, row{subject: "user:carol", tier: "free", rule: "free-api", cost: 1, degraded: true})
	add(1, row{subject: "user:carol", tier: "free", rule: "free-api", cost: 1, allowed: true, degraded: true})
	rd, _ := fixture(t, "series", rows)
	ctx := context.Background()

	want := map[string]audit.Counts{
		"free": {Checks: 18, Allowed: 9, Denied: 4, Delayed: 2, Degraded: 6, DegradedDenied: 5},
		"pro":  {Checks: 10, Allowed: 3, Denied: 7},
	}
	deadline := time.Now().Add(20 * time.Second)
	var s *audit.Series
	for {
		var err error
		if s, err = rd.Series(ctx, audit.SeriesRequest{By: "tier", Span: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if s.Totals["free"] == want["free"] && s.Totals["pro"] == want["pro"] || time.Now().After(deadline) {
			break // a view's rows become visible after the table's
		}
		time.Sleep(100 * time.Millisecond)
	}
	for tier, w := range want {
		if got := s.Totals[tier]; got != w {
			t.Errorf("tier %s over the last hour: got %+v, want %+v", tier, got, w)
		}
	}
	if s.Step != time.Minute || len(s.Keys) != 2 || s.Keys[0] != "free" || len(s.Points) == 0 {
		t.Errorf("series: step %s, keys %v, %d points; want a minute, [free pro], points", s.Step, s.Keys, len(s.Points))
	}
	if s, err := rd.Series(ctx, audit.SeriesRequest{By: "rule", Span: 30 * 24 * time.Hour}); err != nil || s.Step != 24*time.Hour ||
		s.Totals["pro-api"].Denied != 7 {
		t.Errorf("30 days per rule: %+v, %v; want the day rollup with pro-api's 7 denials", s, err)
	}

	top, err := rd.Top(ctx, audit.TopRequest{Span: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// carol's fail-mode denials are no throttling: she is not listed.
	if len(top) != 2 || top[0].Subject != "user:bob" || top[0].Denied != 7 || top[1].Subject != "user:alice" || top[1].Denied != 4 {
		t.Errorf("top throttled: %+v; want bob (7 denied), alice (4), and no carol", top)
	}
	if top, err := rd.Top(ctx, audit.TopRequest{Span: time.Hour, Tier: "free"}); err != nil || len(top) != 1 || top[0].Subject != "user:alice" {
		t.Errorf("top throttled of tier free: %+v, %v; want alice alone", top, err)
	}

	recent, err := rd.Recent(ctx, "user:alice", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != 3 || !recent[0].Allowed || recent[0].DelayMs != 20 || !recent[0].At.After(recent[2].At) {
		t.Errorf("alice's 3 latest checks: %+v; want the delayed ones first, newest first", recent)
	}
}

// TestBilling: a subject's month in a time zone, per day of that zone's calendar, and as CSV.
func TestBilling(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	// The month before this one in Paris: 23:30 on its 1st (Paris) is still the 1st there,
	// 22:30 UTC; 00:30 on the 2nd (Paris) is the 1st in UTC.
	first := time.Date(time.Now().In(paris).Year(), time.Now().In(paris).Month()-1, 1, 0, 0, 0, 0, paris)
	month := first.Format("2006-01")
	rows := []row{
		{at: first.Add(23*time.Hour + 30*time.Minute), subject: "api_key:k1", tier: "pro", rule: "r", cost: 3, allowed: true},
		{at: first.Add(24*time.Hour + 30*time.Minute), subject: "api_key:k1", tier: "pro", rule: "r", cost: 2, allowed: true},
		{at: first.Add(24*time.Hour + 31*time.Minute), subject: "api_key:k1", tier: "pro", rule: "r", cost: 2},
		{at: first.Add(24*time.Hour + 32*time.Minute), subject: "api_key:k2", tier: "pro", rule: "r", cost: 9, allowed: true},
	}
	rd, _ := fixture(t, "billing", rows)
	b, err := rd.Billing(context.Background(), audit.BillingRequest{Subject: "api_key:k1", Month: month, Location: paris})
	if err != nil {
		t.Fatal(err)
	}
	d1, d2 := first.Format("2006-01-02"), first.AddDate(0, 0, 1).Format("2006-01-02")
	if len(b.Days) != 2 || b.Days[0].Day != d1 || b.Days[0].Cost != 3 || b.Days[1].Day != d2 || b.Days[1].Cost != 2 ||
		b.Days[1].Denied != 1 || b.Total.Checks != 3 || b.Total.Cost != 5 {
		t.Errorf("k1's %s in Paris: %+v; want %s cost 3, %s cost 2 and a denial, 3 checks costing 5", month, b, d1, d2)
	}
	var csv bytes.Buffer
	if err := b.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(csv.String()), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "subject,timezone,day,checks") ||
		lines[3] != "api_key:k1,Europe/Paris,total "+month+",3,2,5,1,0,0,0" {
		t.Errorf("CSV:\n%s\nwant a header, two days and the total", csv.String())
	}
}

// TestBadInput: each request that breaks a rule names its field.
func TestBadInput(t *testing.T) {
	t.Parallel()
	rd, err := audit.New(audit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"series by", func() error { _, err := rd.Series(ctx, audit.SeriesRequest{By: "endpoint"}); return err }, "by"},
		{"series span", func() error {
			_, err := rd.Series(ctx, audit.SeriesRequest{By: "tier", Span: 2 * audit.MaxSpan})
			return err
		}, "span"},
		{"top n", func() error { _, err := rd.Top(ctx, audit.TopRequest{N: 1000}); return err }, "n"},
		{"recent subject", func() error { _, err := rd.Recent(ctx, "alice", 0); return err }, "subject"},
		{"billing subject", func() error { _, err := rd.Billing(ctx, audit.BillingRequest{Subject: "who:x"}); return err }, "subject"},
		{"billing month", func() error {
			_, err := rd.Billing(ctx, audit.BillingRequest{Subject: "user:a", Month: "November"})
			return err
		}, "month"},
		{"billing month retained", func() error {
			_, err := rd.Billing(ctx, audit.BillingRequest{Subject: "user:a", Month: "2001-01"})
			return err
		}, "month"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var fe *field.Error
			if err := tt.call(); !errors.As(err, &fe) || fe.Field != tt.field {
				t.Errorf("got %v, want an error naming %s", err, tt.field)
			}
		})
	}
	if _, err := audit.New(audit.Config{Database: "a;drop"}); err == nil {
		t.Error("New with database a;drop: no error, want one")
	}
}
