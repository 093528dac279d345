package dashboard

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/health"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func TestFrame(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 10, 0, 30, 0, time.UTC)
	user := func(id string, allowed bool) *quotaflowv1.Decision {
		return &quotaflowv1.Decision{Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: id}, Allowed: allowed}
	}
	b := newTopBoard(10 * time.Second)
	b.addBatch(now.Add(-20*time.Second), &quotaflowv1.DecisionBatch{Decisions: []*quotaflowv1.Decision{user("old", true)}})
	b.addBatch(now, &quotaflowv1.DecisionBatch{Decisions: []*quotaflowv1.Decision{
		user("alice", true), user("alice", true), user("alice", false), user("bob", true),
		{Kind: quotaflowv1.Kind_KIND_SETTLE, Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "bob"}},
	}})
	b.applyTransition(events.Transition{Dimension: "user", Subject: "bob", RuleID: "r", To: events.StateWarning, At: now})
	b.applyTransition(events.Transition{Dimension: "user", Subject: "alice", RuleID: "r", To: events.StateThrottled, At: now.Add(-time.Second)})
	b.applyTransition(events.Transition{Dimension: "user", Subject: "carol", RuleID: "r", To: events.StateThrottled, At: now})
	b.applyTransition(events.Transition{Dimension: "user", Subject: "carol", RuleID: "r", To: events.StateNormal, At: now})
	tests := []struct {
		name        string
		width, rows int
		want        []*regexp.Regexp
		notWant     string
	}{
		{"all rows", 0, 20, []*regexp.Regexp{
			regexp.MustCompile(`BUSIEST SUBJECTS \(2\)\nSUBJECT\s+CHECKS/S\s+ALLOWED\s+DENIED\nuser:alice\s+0\.3\s+2\s+1\nuser:bob\s+0\.1\s+1\s+0\n`),
			regexp.MustCompile(`CURRENT THROTTLES \(2\)\nSTATE.*\nthrottled\s+user:alice\s+r\s.*\nwarning\s+user:bob\s+r\s`),
		}, "user:old"},
		{"one row", 0, 1, []*regexp.Regexp{regexp.MustCompile(`user:alice .*\n… 1 more\n`), regexp.MustCompile(`throttled .*\n… 1 more`)}, "user:carol"},
		{"narrow", 12, 20, []*regexp.Regexp{regexp.MustCompile(`(?m)^user:alice  $`)}, "CHECKS/S"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Join(b.frame(now, tt.width, tt.rows, "(q quits)"), "\n")
			for _, want := range tt.want {
				if !want.MatchString(got) {
					t.Errorf("frame:\n%s\nwant it to match %s", got, want)
				}
			}
			if strings.Contains(got, tt.notWant) {
				t.Errorf("frame:\n%s\nwant no %q", got, tt.notWant)
			}
		})
	}
}

// TestStatusVersions: processes of two builds, as in a rolling upgrade, are listed by build.
func TestStatusVersions(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	writeVersions(&b, []health.Report{{Role: "checker", Instance: "c1", Version: "v2"}, {Role: "checker", Instance: "c2", Version: "v1"},
		{Role: "aggregator", Instance: "a1", Version: "v2"}})
	if want := "VERSION  v2: checker c1, aggregator a1\nVERSION  v1: checker c2\n"; b.String() != want {
		t.Errorf("versions = %q, want %q", b.String(), want)
	}
}

func TestStatusWrite(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	st := &Status{At: at, Problems: []string{}, FailMode: []string{},
		Processes: []health.Report{{Role: "checker", Instance: "c1", Host: "vm", Started: at.Add(-time.Minute), At: at, Version: "quotaflow v1.4.0 (go1.26.0)",
			Dependencies: map[string]health.Dependency{health.Redis: {State: health.StateDown, Since: at.Add(-3 * time.Second), Error: "refused"}},
			Checker:      &health.CheckerView{}}},
		Overrides: []rules.Override{{ID: "o1", Dimension: "user", Identifier: "vip", RuleID: "r", Multiplier: 2, Source: "penalty",
			ExpiresAt: at.Add(time.Hour)}},
	}
	st.judge()
	var b strings.Builder
	if err := st.Write(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^checker\s+c1\s+vm\s+1m0s\s+DOWN 3s\s+-\s+-\s+0\.0\s+-$`),
		regexp.MustCompile(`(?m)^VERSION  quotaflow v1\.4\.0 \(go1\.26\.0\)$`),
		regexp.MustCompile(`(?m)^DOWN\n  checker c1 sees redis down: refused$`),
		regexp.MustCompile(`(?m)^  o1\s+user:vip rule:r\s+limit×2\s+1h0m0s\s+policy penalty\s*$`),
	} {
		if !want.MatchString(b.String()) {
			t.Errorf("status:\n%s\nwant it to match %s", b.String(), want)
		}
	}
}
