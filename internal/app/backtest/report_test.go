package backtest

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

const reportRules = `
default_tier: free
tiers: {free: {}, pro: {}}
rules:
  - {id: per-user, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 2, window: 1h}
  - {id: per-conn, dimension: user, endpoint: /conn, algorithm: concurrency, limit: 1, window: 1h}
`

func mustRules(t testing.TB, doc string) *rules.Set {
	t.Helper()
	set, err := rules.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestReportReasons feeds recorded checks to a report one by one: every changed answer is
// explained by the first reason that applies, and the rows count what changed.
func TestReportReasons(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rec := func(sec int, user, endpoint string, allowed bool, mod func(*Record)) Record {
		r := Record{TimeUS: base.Add(time.Duration(sec) * time.Second).UnixMicro(), Subjects: []string{"user:" + user}, Subject: user,
			Tier: "free", Endpoint: endpoint, Cost: 1, Allowed: allowed, Rule: "per-user", Limit: 2}
		if mod != nil {
			mod(&r)
		}
		return r
	}
	tests := []struct {
		name    string
		records []Record
		// want is the reason of the last record's changed answer, "" for the same answer.
		want string
	}{
		{"same answers", []Record{rec(1, "alice", "/a", true, nil), rec(2, "alice", "/a", true, nil), rec(3, "alice", "/a", false, nil)}, ""},
		{"fail mode", []Record{rec(1, "alice", "/a", true, nil), rec(2, "alice", "/a", true, nil),
			rec(3, "alice", "/a", true, func(r *Record) { r.Degraded = true })}, reasonFailMode},
		{"override then", []Record{rec(1, "alice", "/a", true, nil), rec(2, "alice", "/a", true, nil),
			rec(3, "alice", "/a", true, func(r *Record) { r.Limit = 4 })}, reasonRules},
		{"settled before", []Record{rec(1, "alice", "/a", true, nil), rec(2, "alice", "/a", true, nil),
			rec(2, "alice", "", true, func(r *Record) { r.Kind = "cancel" }),
			rec(3, "alice", "/a", true, nil)}, reasonSettled},
		{"concurrency", []Record{rec(1, "alice", "/conn", true, nil), rec(2, "alice", "/conn", true, nil)}, reasonConcurrency},
		{"history before the replay", []Record{rec(1, "alice", "/a", false, nil)}, reasonHistory},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set := mustRules(t, reportRules)
			rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
			rp := checker.NewReplay(set, 0)
			for i := range tt.records {
				rep.replay(rp, &tt.records[i])
			}
			rep.finish(0)
			changed := rep.NewlyAllowed + rep.NewlyDenied
			switch {
			case tt.want == "" && changed != 0:
				t.Errorf("got %d changed answers (%v), want none", changed, rep.Reasons)
			case tt.want != "" && (changed != 1 || rep.Reasons[tt.want] != 1):
				t.Errorf("got %d changed answers, reasons %v; want one, %s", changed, rep.Reasons, tt.want)
			}
		})
	}
}

// TestReportFollowsEarlierChange: a changed answer in a bucket whose replayed state an
// earlier changed answer made differ (here the replay charged a check an override had denied)
// is explained by that earlier answer's reason, for as long as a charge lasts in the bucket;
// one after that is history.
func TestReportFollowsEarlierChange(t *testing.T) {
	t.Parallel()
	const rules = `
rules:
  - {id: per-user, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 2, window: 1m}
`
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rec := func(at time.Duration, allowed bool, limit int64) Record {
		return Record{TimeUS: base.Add(at).UnixMicro(), Subjects: []string{"user:alice"}, Subject: "alice",
			Tier: "default", Endpoint: "/a", Cost: 1, Allowed: allowed, Rule: "per-user", Limit: limit}
	}
	for _, tt := range []struct {
		name  string
		third Record
		want  map[string]int64
	}{
		// Redis allowed the third check (used 2 of 2); the replay, one charge ahead, denies it.
		{"within the window", rec(30*time.Second, true, 2), map[string]int64{reasonRules: 2}},
		// Minutes later, the charge the replay made is long gone: a difference then (a
		// denial Redis gave a fresh window) is history.
		{"after the window", rec(3*time.Minute, false, 2), map[string]int64{reasonRules: 1, reasonHistory: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set := mustRules(t, rules)
			rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
			rp := checker.NewReplay(set, 0)
			// An override of 1 denied the second check; the replay, at 2, allows and charges
			// it, and then denies the third, which Redis allowed.
			records := []Record{rec(time.Second, true, 2), rec(2*time.Second, false, 1), tt.third}
			for i := range records {
				rep.replay(rp, &records[i])
			}
			rep.finish(0)
			if len(rep.Reasons) != len(tt.want) {
				t.Fatalf("reasons %v, want %v", rep.Reasons, tt.want)
			}
			for k, n := range tt.want {
				if rep.Reasons[k] != n {
					t.Errorf("reasons %v, want %v", rep.Reasons, tt.want)
				}
			}
		})
	}
}

// TestReportRows: a lower limit replayed over a subject's checks reports the newly denied
// ones under the rule and tier, the subject and the hour, in every format.
func TestReportRows(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	lower := mustRules(t, strings.Replace(reportRules, "limit: 2, window: 1h}", "limit: 1, window: 1h}", 1))
	rep := newReport(Request{Rules: lower, From: base, To: base.Add(2 * time.Hour)})
	rp := checker.NewReplay(lower, 0)
	for i, user := range []string{"bob", "bob", "bob", "carol"} {
		r := Record{TimeUS: base.Add(time.Duration(i) * time.Minute).UnixMicro(), Subjects: []string{"user:" + user}, Subject: user,
			Tier: "free", Endpoint: "/a", Cost: 1, Allowed: i < 2 || user == "carol", Rule: "per-user", Limit: 2}
		rep.replay(rp, &r)
	}
	// A row whose subject quotaflow never writes is counted, not compared.
	rep.replay(rp, &Record{TimeUS: base.UnixMicro(), Subjects: []string{"person:x"}, Tier: "free", Endpoint: "/a", Cost: 1})
	rep.finish(0)
	if rep.Skipped.Unreadable != 1 {
		t.Errorf("got %d unreadable rows, want 1", rep.Skipped.Unreadable)
	}
	if rep.Checks != 4 || rep.NewlyDenied != 1 || rep.NewlyAllowed != 0 || rep.Reasons[reasonRules] != 1 {
		t.Fatalf("got checks %d, newly denied %d, allowed %d, reasons %v; want 4, 1, 0, one rules_differ",
			rep.Checks, rep.NewlyDenied, rep.NewlyAllowed, rep.Reasons)
	}
	want := RuleRow{Rule: "per-user", Tier: "free", Checks: 4, DeniedThen: 1, WouldDeny: 2, NewlyDenied: 1}
	if len(rep.Rules) != 1 || rep.Rules[0] != want {
		t.Errorf("rules: got %+v, want %+v", rep.Rules, want)
	}
	if len(rep.Subjects) != 1 || rep.Subjects[0] != (SubjectRow{Subject: "user:bob", NewlyDenied: 1}) {
		t.Errorf("subjects: got %+v, want bob with 1 newly denied", rep.Subjects)
	}
	if len(rep.Hours) != 1 || rep.Hours[0].Checks != 4 || rep.Hours[0].NewlyDenied != 1 {
		t.Errorf("hours: got %+v, want one hour of 4 checks, 1 newly denied", rep.Hours)
	}
	var table, csvOut bytes.Buffer
	if err := rep.WriteTable(&table); err != nil || !strings.Contains(strings.Join(strings.Fields(table.String()), " "), "newly denied 1 newly allowed 0") {
		t.Errorf("table: %v\n%s\nwant newly denied 1", err, table.String())
	}
	if err := rep.WriteCSV(&csvOut); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&csvOut).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range rows {
		found = found || strings.Join(r, ",") == "rule,per-user,free,4,1,2,1,0,"
	}
	if !found {
		t.Errorf("csv: %q, want the rule's row", rows)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	set := mustRules(t, reportRules)
	now := time.Now()
	tests := []struct {
		name  string
		req   Request
		field string
	}{
		{"no rules", Request{From: now.Add(-time.Hour)}, "rules"},
		{"no from", Request{Rules: set}, "from"},
		{"to before from", Request{Rules: set, From: now.Add(-time.Hour), To: now.Add(-2 * time.Hour)}, "to"},
		{"from in the future", Request{Rules: set, From: now.Add(time.Hour), To: now.Add(2 * time.Hour)}, "from"},
		{"outside the retention", Request{Rules: set, From: now.AddDate(0, 0, -91)}, "from"},
		{"unknown rule", Request{Rules: set, From: now.Add(-time.Hour), Rule: "nope"}, "rule"},
		{"unknown tier", Request{Rules: set, From: now.Add(-time.Hour), Tier: "gold"}, "tier"},
		{"bad subject", Request{Rules: set, From: now.Add(-time.Hour), Subject: "person:x"}, "subject"},
		{"negative top", Request{Rules: set, From: now.Add(-time.Hour), Top: -1}, "top"},
		{"huge top", Request{Rules: set, From: now.Add(-time.Hour), Top: 1 << 40}, "top"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := validate(&tt.req, now)
			fe, ok := err.(*field.Error)
			if !ok || fe.Field != tt.field {
				t.Errorf("got %v, want a field.Error about %s", err, tt.field)
			}
		})
	}
}

func TestParseSubject(t *testing.T) {
	t.Parallel()
	entries := []rules.Entry{{Key: "tenant", Value: "a,b=c%d"}, {Key: "path", Value: ""}}
	desc := checker.DescriptorSubject(entries)
	tests := []struct {
		in      string
		want    checker.Subject
		wantErr bool
	}{
		{in: "user:alice", want: checker.Subject{Dimension: rules.DimensionUser, ID: "alice"}},
		{in: "api_key:k:1", want: checker.Subject{Dimension: rules.DimensionAPIKey, ID: "k:1"}},
		{in: "ip:10.0.0.1", want: checker.Subject{Dimension: rules.DimensionIP, ID: "10.0.0.1"}},
		{in: "descriptor:" + desc.ID, want: desc},
		{in: "descriptor:tenant=%zz", wantErr: true},
		{in: "descriptor:tenant", wantErr: true},
		{in: "person:x", wantErr: true},
		{in: "user:", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseSubject(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseSubject(%q): error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && (got.Dimension != tt.want.Dimension || got.ID != tt.want.ID || len(got.Entries) != len(tt.want.Entries)) {
			t.Errorf("parseSubject(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

// TestReportLoweredLimitIsNoRefund: under a lowered limit, the checks the replay alone denies
// charged the global bucket in no Redis: the later changed answers are the rules', not a
// refund's.
func TestReportLoweredLimitIsNoRefund(t *testing.T) {
	t.Parallel()
	set := mustRules(t, `
rules:
  - {id: per-user, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 3, window: 1h}
  - {id: all, dimension: global, endpoint: "*", algorithm: fixed_window, limit: 100, window: 1h}
`)
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
	rp := checker.NewReplay(set, 0)
	for i := range 5 {
		rep.replay(rp, &Record{TimeUS: base.Add(time.Duration(i) * time.Millisecond).UnixMicro(), Subjects: []string{"user:alice"},
			Subject: "alice", Tier: "", Endpoint: "/a", Cost: 1, Allowed: true, Rule: "per-user", Limit: 5})
	}
	rep.finish(0)
	if rep.NewlyDenied != 2 || rep.Reasons[reasonRules] != 2 || len(rep.Reasons) != 1 {
		t.Errorf("got %d newly denied, reasons %v; want 2, both rules_differ", rep.NewlyDenied, rep.Reasons)
	}
}

// TestReportReplaysDelays: a rule that delays instead of denying replays as Redis decided it:
// checks queued within max_delay were allowed, the one past it denied.
func TestReportReplaysDelays(t *testing.T) {
	t.Parallel()
	set := mustRules(t, `
rules:
  - {id: paced, dimension: user, endpoint: "*", algorithm: gcra, limit: 2, window: 1s, burst: 1, on_limit: delay, max_delay: 1s}
`)
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
	rp := checker.NewReplay(set, 0)
	// A slot every 500 ms and 1 s of queue: at once, then after 500 ms and 1 s, then denied.
	for i, allowed := range []bool{true, true, true, false} {
		rec := Record{TimeUS: base.Add(time.Duration(i+1) * time.Millisecond).UnixMicro(), Subjects: []string{"user:alice"}, Subject: "alice",
			Tier: "default", Endpoint: "/a", Cost: 1, Allowed: allowed, Rule: "paced", Limit: 1}
		rep.replay(rp, &rec)
	}
	rep.finish(0)
	if rep.Checks != 4 || rep.Agreed != 4 {
		t.Errorf("%d of %d checks replayed with the recorded answer (reasons %v), want 4 of 4", rep.Agreed, rep.Checks, rep.Reasons)
	}
}

// TestReportRefundOfTheSameInstant: the checks of one batch script run share Redis's instant,
// and the audit does not keep their order. A denial whose charge of the global bucket Redis
// refunded later may be replayed after the check it made Redis deny: that change is still the
// refund's, not history.
func TestReportRefundOfTheSameInstant(t *testing.T) {
	t.Parallel()
	set := mustRules(t, `
rules:
  - {id: per-user, dimension: user, endpoint: "*", algorithm: fixed_window, limit: 1, window: 1h}
  - {id: all, dimension: global, endpoint: "*", algorithm: fixed_window, limit: 2, window: 1h}
`)
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	rec := func(at time.Duration, user string, allowed bool, rule string, limit int64) Record {
		return Record{TimeUS: base.Add(at).UnixMicro(), Subjects: []string{"user:" + user}, Subject: user,
			Endpoint: "/a", Cost: 1, Allowed: allowed, Rule: rule, Limit: limit}
	}
	for _, tt := range []struct {
		name  string
		later time.Duration // when alice's denial is recorded, after bob's
		want  map[string]int64
	}{
		// Redis ran alice's check (denied by per-user, its global charge refunded later), then
		// bob's (denied: the global bucket held alice's charge); the replay meets bob first.
		{"same instant", 0, map[string]int64{ReasonRefund: 1}},
		// A denial after bob's check charged nothing bob saw.
		{"a microsecond later", time.Microsecond, map[string]int64{reasonHistory: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
			rp := checker.NewReplay(set, 0)
			records := []Record{rec(0, "alice", true, "per-user", 1),
				rec(time.Second, "bob", false, "all", 2), rec(time.Second+tt.later, "alice", false, "per-user", 1)}
			for i := range records {
				rep.replay(rp, &records[i])
			}
			rep.finish(0)
			if rep.NewlyAllowed != 1 || len(rep.Reasons) != len(tt.want) || rep.Reasons[ReasonRefund] != tt.want[ReasonRefund] ||
				rep.Reasons[reasonHistory] != tt.want[reasonHistory] {
				t.Errorf("got %d newly allowed, reasons %v; want 1, %v", rep.NewlyAllowed, rep.Reasons, tt.want)
			}
		})
	}
}

// TestPlanCacheBytes: the cache of planned checks holds at most MaxPlanBytes: past it, it
// starts again, and what it holds never exceeds the bound; the answers are the same.
func TestPlanCacheBytes(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	set := mustRules(t, reportRules)
	var agreed []int64
	for _, bound := range []int64{0, 2000} {
		rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
		rep.maxPlanBytes = bound
		rp := checker.NewReplay(set, 0)
		for i := range 50 {
			user := fmt.Sprintf("u%d", i%25)
			rep.replay(rp, &Record{TimeUS: base.Add(time.Duration(i) * time.Second).UnixMicro(), Subjects: []string{"user:" + user},
				Subject: user, Tier: "free", Endpoint: "/a", Cost: 1, Allowed: true, Rule: "per-user", Limit: 2})
			if bound > 0 && rep.planBytes > bound {
				t.Fatalf("after record %d: the cache holds %d bytes, above its bound %d", i, rep.planBytes, bound)
			}
		}
		if bound > 0 && (len(rep.plans) == 0 || len(rep.plans) >= 25) {
			t.Errorf("a cache bounded to %d bytes holds %d plans of 25 distinct checks, want some but not all", bound, len(rep.plans))
		}
		rep.finish(0)
		agreed = append(agreed, rep.Agreed)
	}
	if agreed[0] != 50 || agreed[1] != 50 {
		t.Errorf("agreed %v with and without the bound, want 50 each", agreed)
	}
}

// TestReportRecovered: a decision recovered from the balance journal (its check's own lost in
// a crash) is no request to replay nor a settle skipped, but the subject's history has a hole:
// a changed answer after it is not the rules'.
func TestReportRecovered(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	set := mustRules(t, reportRules)
	rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
	rp := checker.NewReplay(set, 0)
	for i, kind := range []string{"", "", "recovered", ""} {
		rep.replay(rp, &Record{TimeUS: base.Add(time.Duration(i+1) * time.Second).UnixMicro(), Subjects: []string{"user:alice"}, Subject: "alice",
			Tier: "free", Endpoint: "/a", Cost: 1, Allowed: true, Rule: "per-user", Limit: 2, Kind: kind})
	}
	rep.finish(0)
	if rep.Skipped.Settles != 0 || rep.NewlyDenied != 1 || rep.Reasons[reasonSettled] != 1 {
		t.Errorf("skipped settles %d, newly denied %d, reasons %v; want 0, 1 and the subject's history", rep.Skipped.Settles, rep.NewlyDenied, rep.Reasons)
	}
}
