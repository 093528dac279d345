package checker

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// benchEntitlementRules: BenchmarkDecide's one limit, on an endpoint that also burns a
// balance of two grants.
const benchEntitlementRules = benchRules + `- {id: metered, dimension: user, endpoint: /metered, algorithm: token_bucket, limit: 1000000000, window: 1s}
entitlements:
- {id: tokens, dimension: user, endpoints: [/metered], period: 1mo, thresholds: {used_percent: [50, 80, 100]}}
`

// BenchmarkDecideBalance measures Engine.Check of one token bucket limit, alone (/one) and
// with a balance burned in the same script call (/metered: two grants, three thresholds), over
// 1000 subjects: what an entitlement adds to a check, in the process and in Redis; and the
// same with decisions published (a sink that drops them), so that each burn is journaled and
// its entry dropped after (trim-µs/check: the HDELs' Redis time).
func BenchmarkDecideBalance(b *testing.B) {
	for _, c := range []struct {
		name, ep string
		sink     DecisionSink // with one, balances are journaled
	}{{"limit", "/one", nil}, {"limit-and-balance", "/metered", nil}, {"limit-and-balance-journaled", "/metered", discardSink{}}} {
		b.Run(c.name, func(b *testing.B) {
			e := newEngine(b, Config{Rules: mustRules(b, benchEntitlementRules), Decisions: c.sink})
			rdb := checkertest.Redis(redisSrv.Addr)
			defer rdb.Close()
			run := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + c.name // each round its own subjects: grants add up
			for i := range 1000 {
				for _, g := range []rules.Grant{{Amount: rules.MaxAmount / 4, Recurring: true}, {Amount: rules.MaxAmount / 4, Priority: 2}} {
					g.Entitlement, g.Subject, g.Reason = "tokens", run+"-"+strconv.Itoa(i), "bench"
					if _, _, err := e.PutGrant(context.Background(), g); err != nil {
						b.Fatal(err)
					}
				}
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			before, calls, trims := scriptMicros(b, rdb), scriptCallCount(b, rdb), commandMicros(b, rdb, "hdel")
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					out, err := e.Check(context.Background(), userQuery(run+"-"+strconv.Itoa(int(n.Add(1)%1000)), c.ep))
					if err != nil || !out.Allowed {
						b.Fatalf("check: %v allowed=%v", err, out != nil && out.Allowed)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric((scriptMicros(b, rdb)-before)/float64(b.N), "redis-µs/check")
			b.ReportMetric(float64(b.N)/(scriptCallCount(b, rdb)-calls), "checks/script-call")
			// The journal's trims, asynchronous; a few may land after this reading.
			b.ReportMetric((commandMicros(b, rdb, "hdel")-trims)/float64(b.N), "trim-µs/check")
		})
	}
}

// discardSink drops every decision, as durable: a sink that costs nothing.
type discardSink struct{}

func (discardSink) Publish(string, *Query, *Outcome) {}

// BenchmarkUsageRecordMemory records usage of 100,000 event ids (QUOTAFLOW_MEMBENCH_KEYS) into
// 100 balances on a Redis of its own, and reports the growth of used_memory per record (the
// record's key and value, its expiry and hash-table slots), and the MEMORY USAGE of one
// balance of two grants. It ignores b.N: run it once, with -benchtime=1x.
//
//	go test -run='^$' -bench=UsageRecordMemory -benchtime=1x ./checker/
func BenchmarkUsageRecordMemory(b *testing.B) {
	records := 100_000
	if v, err := strconv.Atoi(os.Getenv("QUOTAFLOW_MEMBENCH_KEYS")); err == nil && v > 0 {
		records = v
	}
	rs, err := redistest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	rdb := checkertest.Redis(rs.Addr)
	defer rdb.Close()
	e := newEngine(b, Config{Redis: rdb, Rules: mustRules(b, benchEntitlementRules)})
	ctx := context.Background()
	for i := range 100 {
		for _, g := range []rules.Grant{{Amount: rules.MaxAmount / 4, Recurring: true}, {Amount: rules.MaxAmount / 4, Priority: 2}} {
			g.Entitlement, g.Subject, g.Reason = "tokens", "u"+strconv.Itoa(i), "bench"
			if _, _, err := e.PutGrant(ctx, g); err != nil {
				b.Fatal(err)
			}
		}
	}
	use := func(from, to int) {
		var wg sync.WaitGroup
		var next atomic.Int64
		next.Store(int64(from))
		for range 32 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < to; i = int(next.Add(1)) - 1 {
					if _, err := e.RecordUsage(ctx, MeteredUsage{Entitlement: "tokens", Subject: "u" + strconv.Itoa(i%100), Amount: 1,
						EventID: "evt-" + strconv.Itoa(i)}); err != nil {
						b.Errorf("use %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	use(0, 1000) // the balances' first charges: their periods, counters and marks
	memBefore := usedMemory(b, rdb)
	use(1000, 1000+records)
	mem := usedMemory(b, rdb) - memBefore
	b.ReportMetric(float64(mem)/float64(records), "bytes/record")
	b.ReportMetric(float64(rdb.MemoryUsage(ctx, balanceKey(&rules.Entitlement{ID: "tokens", Dimension: rules.DimensionUser},
		Subject{Dimension: rules.DimensionUser, ID: "u0"})).Val()), "memory-usage-bytes/balance")
}
