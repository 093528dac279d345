package publisher

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// BenchmarkPublish measures publishing until every decision is acked.
//
//   - embedded, process: GOMAXPROCS goroutines publish as fast as they can, against the
//     package's embedded server or a nats-server process. ns/op is the end-to-end time per
//     decision, publish-ns/op the publishing phase alone; when the batcher cannot keep up,
//     Publish spills into the spool (spooled/op).
//   - process-100k: one goroutine publishes 100k decisions/s, the checker's target; cpu-% is
//     the test process's CPU use (of all cores), the server running in its own process.
//   - baseline-100k: the same loop making the same decisions without publishing them: the
//     difference to process-100k is what publishing costs.
//
// allocs/op and mallocs/decision (unrounded) count every allocation of the process, 2 of
// them the caller's (the Decision and its Subject).
func BenchmarkPublish(b *testing.B) {
	process := func(b *testing.B) *nats.Conn {
		p, err := natstest.StartProcess()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		return connectURL(b, p.URL)
	}
	b.Run("embedded", func(b *testing.B) { benchPublish(b, connect(b), 0) })
	b.Run("process", func(b *testing.B) { benchPublish(b, process(b), 0) })
	b.Run("process-100k", func(b *testing.B) { benchPublish(b, process(b), 100_000) })
	b.Run("baseline-100k", func(b *testing.B) { benchPublish(b, nil, 100_000) })
}

// benchDecisions makes decisions as a checker would, over 1024 subjects.
type benchDecisions []string

func newBenchDecisions() benchDecisions {
	idents := make([]string, 1024)
	for i := range idents {
		idents[i] = "user-" + strconv.Itoa(i)
	}
	return idents
}

func (idents benchDecisions) make(i int) *quotaflowv1.Decision {
	return &quotaflowv1.Decision{
		Id:        "bench-decision-0000000000",
		CheckerId: "bench",
		TimeUs:    1700000000000000 + int64(i),
		Subject:   &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: idents[i&1023]},
		Endpoint:  "/api/v1/orders",
		RuleId:    "user-min",
		Algorithm: "gcra",
		Cost:      1,
		Allowed:   true,
		Limit:     100,
		Remaining: 42,
		WindowMs:  60000,
		ResetAt:   1700000000,
	}
}

// benchSink keeps the baseline's decisions from being optimized away.
var benchSink *quotaflowv1.Decision

// benchPublish publishes b.N decisions, as fast as GOMAXPROCS goroutines can (rate 0), or
// from one goroutine at rate decisions/s. With a nil nc it only makes the decisions.
func benchPublish(b *testing.B, nc *nats.Conn, rate int) {
	decisions := newBenchDecisions()
	publish := func(d *quotaflowv1.Decision) { benchSink = d }
	var c *Client
	var cfg Config
	if nc != nil {
		cfg = testConfig(b)
		cfg.Logger = slog.New(slog.DiscardHandler)
		c = newClient(b, nc, cfg)
		publish = c.PublishDecision
		poll.Until(b, 10*time.Second, "direct mode", poll.True(func() bool {
			c.modeMu.Lock()
			defer c.modeMu.Unlock()
			return c.mode == modeDirect
		}))
	}
	runtime.GC()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0 := cpuTime()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if rate == 0 {
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				publish(decisions.make(i))
			}
		})
	} else {
		// Each millisecond, publish what the rate allows up to now.
		tick := time.NewTicker(time.Millisecond)
		for i := 0; i < b.N; <-tick.C {
			for due := min(int(time.Since(start).Seconds()*float64(rate)), b.N); i < due; i++ {
				publish(decisions.make(i))
			}
		}
		tick.Stop()
	}
	publishing := time.Since(start)
	if c != nil {
		poll.Until(b, time.Minute, "the decisions acked", acked(c, b.N))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&mem1)
	b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/float64(b.N), "mallocs/decision")
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds()/float64(runtime.GOMAXPROCS(0)), "cpu-%")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/decision")
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		b.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	st := c.Stats()
	if st.Dropped != 0 {
		b.Errorf("Dropped = %d, want 0", st.Dropped)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(info.State.Msgs)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(publishing.Nanoseconds())/float64(b.N), "publish-ns/op")
	b.ReportMetric(float64(st.Spooled)/float64(b.N), "spooled/op")
}

// cpuTime returns the CPU time the process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPublishDurable measures what a check pays for its decision: 64 goroutines (the
// checks in flight) call PublishDurable as the engine does, against a nats-server process,
// answered at once with the decision batched in memory (memory: NoSpoolWait) or once it is
// written to the spool (spool: the default). cpu-ns/decision is the process's CPU per
// decision until every decision is acked; decisions/write is how many checks share a
// write(2); msgs/s the messages the stream stored.
func BenchmarkPublishDurable(b *testing.B) {
	p, err := natstest.StartProcess()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	for _, mode := range []string{"memory", "spool"} {
		b.Run(mode, func(b *testing.B) {
			nc := connectURL(b, p.URL)
			cfg := testConfig(b)
			cfg.Logger = slog.New(slog.DiscardHandler)
			cfg.NoSpoolWait = mode == "memory"
			c := newClient(b, nc, cfg)
			poll.Until(b, 10*time.Second, "stream ready", poll.True(func() bool { return c.streamReady.Load() }))
			var n atomic.Int64
			cpu0 := cpuTime()
			b.ReportAllocs()
			b.SetParallelism(64 / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					q, out, _ := durableCheck("bench-decision-"+strconv.FormatInt(i, 10), "user-"+strconv.FormatInt(i%1024, 10), i)
					c.PublishDurable(context.Background(), "bench", q, out)
				}
			})
			poll.Until(b, time.Minute, "the decisions acked", acked(c, b.N))
			elapsed := time.Since(start)
			b.StopTimer()
			cpu := cpuTime() - cpu0
			st := c.Stats()
			if st.Dropped != 0 || st.Unspooled != 0 {
				b.Errorf("stats %+v, want none dropped or unspooled", st)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			js, _ := jetstream.New(nc)
			s, err := js.Stream(ctx, cfg.Stream)
			if err != nil {
				b.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/decision")
			b.ReportMetric(float64(info.State.Msgs)/elapsed.Seconds(), "msgs/s")
			if w := c.writes.Load(); w > 0 {
				b.ReportMetric(float64(st.Spooled)/float64(w), "decisions/write")
			}
		})
	}
}

// acked is the condition that the stream acked n decisions of c.
func acked(c *Client, n int) func() error {
	return func() error {
		if st := c.Stats(); st.Published+st.Replayed < int64(n) {
			return fmt.Errorf("not all %d decisions acked: %+v", n, st)
		}
		return nil
	}
}
