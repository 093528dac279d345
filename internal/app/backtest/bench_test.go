package backtest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
)

// BenchmarkReplay replays recorded checks of 10,000 users under deploy/bench's rules (two per
// user, one global), as Backtester.Run does after reading them: the replay's own cost per
// decision, without ClickHouse.
func BenchmarkReplay(b *testing.B) {
	doc, err := os.ReadFile("../../deploy/bench/backtest-rules.yaml")
	if err != nil {
		b.Fatal(err)
	}
	set := mustRules(b, string(doc))
	base := time.Now().Add(-time.Hour)
	recs := make([]Record, 1<<16)
	for i := range recs {
		u := fmt.Sprintf("user:u%d", i*7919%10000)
		recs[i] = Record{Subjects: []string{u}, Subject: u[len("user:"):], Tier: "free", Endpoint: "/api/items", Cost: 1, Allowed: i%10 != 0,
			Rule: "user-minute", Limit: 50}
	}
	rep := newReport(Request{Rules: set, From: base, To: base.Add(time.Hour)})
	rp := checker.NewReplay(set, 0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r := &recs[i%len(recs)]
		r.TimeUS = base.Add(time.Duration(i) * 100 * time.Microsecond).UnixMicro()
		rep.replay(rp, r)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}
