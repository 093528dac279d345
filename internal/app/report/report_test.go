package report_test

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/report"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func TestOverride(t *testing.T) {
	t.Parallel()
	exp := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		o    rules.Override
		want string
	}{
		{"subject, limit", rules.Override{ID: "o1", Dimension: "user", Identifier: "alice", Limit: 200, ExpiresAt: exp}, "override o1: user:alice limit=200 until "},
		{"tier on a rule, multiplier", rules.Override{ID: "o2", Tier: "free", RuleID: "r", Multiplier: 0.5, ExpiresAt: exp}, "override o2: tier:free rule:r limit×0.5 until "},
		{"rule", rules.Override{ID: "o3", RuleID: "r", Limit: 5, ExpiresAt: exp}, "override o3: rule:r limit=5 until "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := report.Override(&tt.o); !strings.HasPrefix(got, tt.want) {
				t.Errorf("Override = %q, want it to start %q", got, tt.want)
			}
		})
	}
}

func TestDecisionWrite(t *testing.T) {
	t.Parallel()
	d := report.CheckDecision(&quotaflowv1.CheckRateLimitResponse{Allowed: false, RetryAfterMs: 1500, Tier: "free",
		State: quotaflowv1.State_STATE_THROTTLED, RuleId: "r", Limit: 10, Limits: []*quotaflowv1.LimitStatus{{
			RuleId: "r", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "alice", Algorithm: "gcra", Limit: 10, Burst: 12,
			WindowMs: 60000, CurrentCount: 12, State: quotaflowv1.State_STATE_THROTTLED, Degraded: true, FailMode: "closed"}}})
	var b bytes.Buffer
	if err := d.Write(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DENIED (retry after 1.5s)  tier=free  state=throttled  rule=r", "user:alice", "10/1m burst 12",
		"throttled (degraded: fail closed)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Write printed:\n%s\nwant it to contain %q", b.String(), want)
		}
	}
	var held bytes.Buffer
	report.CheckDecision(&quotaflowv1.CheckRateLimitResponse{Allowed: true, LeaseId: "h.abc", LeaseExpiresAtMs: 1796000000000}).Write(&held)
	if !strings.Contains(held.String(), "lease h.abc until 2026-11-30T") {
		t.Errorf("an allowed check with a lease printed %q, want its id and expiry", held.String())
	}
	var delayed bytes.Buffer
	report.CheckDecision(&quotaflowv1.CheckRateLimitResponse{Allowed: true, DelayUs: 200_000, Tier: "free"}).Write(&delayed)
	if !strings.HasPrefix(delayed.String(), "DELAYED (go on after 0.200s)  tier=free") {
		t.Errorf("a delayed check printed %q, want DELAYED with its wait", delayed.String())
	}
	var none bytes.Buffer
	report.QuotaDecision(&quotaflowv1.GetRemainingQuotaResponse{Allowed: true}).Write(&none)
	if !strings.Contains(none.String(), "ALLOWED") || !strings.Contains(none.String(), "no rule matched") {
		t.Errorf("a decision without limits printed %q, want ALLOWED and no rule matched", none.String())
	}
}

// TestRulesDescriptors: a rules table shows what a descriptor rule matches and its Envoy
// fields, and an unlimited rule's missing algorithm, limit and window as dashes.
func TestRulesDescriptors(t *testing.T) {
	t.Parallel()
	doc := &rules.Document{Rules: []rules.DocRule{
		{ID: "pair", Dimension: "descriptor", Endpoint: "/rl", Algorithm: "fixed_window", Limit: "2", Window: "1m", CountDenied: "true",
			Name: "bk", Replaces: []string{"a", "b"}, Descriptor: []rules.DocEntry{{Key: "src", Value: "proxy"}, {Key: "dst"}}},
		{ID: "free", Dimension: "descriptor", Endpoint: "/rl", Unlimited: "true", Descriptor: []rules.DocEntry{{Key: "health"}}},
		{ID: "q", Dimension: "user", Endpoint: "/x", Algorithm: "gcra", Limit: "5", Window: "1s", OnLimit: "delay", MaxDelay: "600ms"},
		{ID: "q3", CandidateOf: "q", Limit: "3"},
	}}
	var b bytes.Buffer
	if err := report.Rules(&b, doc, 0); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"descriptor:src=proxy,dst=*", "count_denied,name=bk,replaces=a+b",
		"free  descriptor:health=*         /rl       -     -             -      -       -      unlimited",
		"delay<=600ms", "candidate_of=q",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table\n%s\nlacks %q", b.String(), want)
		}
	}
}

// TestRulesWidth: the dev rules' table fits 100 columns, cutting the long Envoy ids, and
// --wide (width 0) prints every column in full.
func TestRulesWidth(t *testing.T) {
	t.Parallel()
	doc, _, err := rules.LoadFile("../../../deploy/dev/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	long := "edge.source_cluster_proxy.destination_cluster_payments"
	for _, tt := range []struct {
		width            int
		want, notWant    []string
		maxLine, minLine int
	}{
		{report.Width, []string{"ID  ", "LIMIT", "5/10s", "premium-api-minute", "1000/1s shadow", "/api/v1/search", "edge.sour…_payments"}, []string{long, "BURST", "count_denied"}, report.Width, 0},
		{0, []string{long, "BURST", "WINDOW", "descriptor:source_cluster=proxy,destination_cluster=payments"}, nil, 0, report.Width + 1},
	} {
		var b bytes.Buffer
		if err := report.Rules(&b, doc, tt.width); err != nil {
			t.Fatal(err)
		}
		longest := 0
		for line := range strings.Lines(b.String()) {
			longest = max(longest, utf8.RuneCountInString(strings.TrimSuffix(line, "\n")))
		}
		if tt.maxLine > 0 && longest > tt.maxLine || longest < tt.minLine {
			t.Errorf("width %d: longest line %d, want at most %d and at least %d:\n%s", tt.width, longest, tt.maxLine, tt.minLine, b.String())
		}
		for _, want := range tt.want {
			if !strings.Contains(b.String(), want) {
				t.Errorf("width %d: table lacks %q:\n%s", tt.width, want, b.String())
			}
		}
		for _, not := range tt.notWant {
			if strings.Contains(b.String(), not) {
				t.Errorf("width %d: table has %q:\n%s", tt.width, not, b.String())
			}
		}
	}
}
