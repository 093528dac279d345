package bucket

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// benchLimits returns n limits of mixed algorithms for one subject, large enough never to
// deny, so the benchmark measures the allowed path. (At 2^40 per hour a token bucket or algorithm.GCRA
// key is full again, and expires, about 1 ms after a check: most checks write a new key.)
func benchLimits(prefix string, n int) []Limit {
	algs := []algorithm.ID{algorithm.GCRA, algorithm.TokenBucket, algorithm.SlidingWindowCounter}
	ls := make([]Limit, n)
	for i := range ls {
		ls[i] = lim(fmt.Sprintf("{%s}:%d", prefix, i), algs[i%len(algs)], 1<<40, time.Hour, 0)
	}
	return ls
}

// redisStats is a snapshot of the servers' script command counters and their CPU time: of
// the one server, or summed over a cluster's masters (whose count divides them per master).
type redisStats struct {
	calls, usec int64   // cmdstat_evalsha + cmdstat_eval + cmdstat_fcall
	cpu         float64 // used_cpu_user + used_cpu_sys, in seconds
	servers     int
}

func readRedisStats(tb testing.TB, c redis.UniversalClient) redisStats {
	tb.Helper()
	ctx := context.Background()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return parseRedisStats(tb, c.Info(ctx, "commandstats", "cpu"))
	}
	var mu sync.Mutex
	var sum redisStats
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		st := parseRedisStats(tb, m.Info(ctx, "commandstats", "cpu"))
		mu.Lock()
		defer mu.Unlock()
		sum.calls, sum.usec, sum.cpu, sum.servers = sum.calls+st.calls, sum.usec+st.usec, sum.cpu+st.cpu, sum.servers+1
		return nil
	})
	if err != nil {
		tb.Fatalf("INFO of the masters: %v", err)
	}
	return sum
}

func parseRedisStats(tb testing.TB, cmd *redis.StringCmd) redisStats {
	tb.Helper()
	info, err := cmd.Result()
	if err != nil {
		tb.Fatalf("INFO: %v", err)
	}
	st := redisStats{servers: 1}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall":
			for f := range strings.SplitSeq(val, ",") {
				k, v, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					st.calls += n
				case "usec":
					st.usec += n
				}
			}
		case "used_cpu_user", "used_cpu_sys":
			f, _ := strconv.ParseFloat(val, 64)
			st.cpu += f
		}
	}
	return st
}

// reportRedis reports the Redis time per check between two snapshots: script time as
// INFO commandstats measures it (what one script call costs), and the whole server's CPU
// (which adds reading, parsing and writing the protocol).
func reportRedis(b *testing.B, before, after redisStats, checks int) {
	if checks == 0 {
		return
	}
	b.ReportMetric(float64(after.usec-before.usec)/float64(checks), "redis-script-µs/check")
	b.ReportMetric((after.cpu-before.cpu)*1e6/float64(checks), "redis-cpu-µs/check")
	if after.servers > 1 { // a cluster: the share of one master, for the capacity model
		b.ReportMetric((after.cpu-before.cpu)/b.Elapsed().Seconds()/float64(after.servers), "redis-cpu-per-master")
	}
}

// processCPU is the CPU time (user + system) of this process, without the redis-server.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchConfig is the StoreConfig of the Store benchmarks; QF_BENCH_LOOPS and
// QF_BENCH_PAR override the loops and the goroutines per CPU, for exploring.
func benchConfig() (StoreConfig, int) {
	var cfg StoreConfig
	par := 16
	if v, err := strconv.Atoi(os.Getenv("QF_BENCH_LOOPS")); err == nil {
		cfg.Loops = v
	}
	if v, err := strconv.Atoi(os.Getenv("QF_BENCH_PAR")); err == nil {
		par = v
	}
	return cfg, par
}

// BenchmarkStoreCheck runs checks of one subject each from many goroutines, so that the
// Store's batcher has concurrency to work with. Besides checks/s and allocations it reports
// go-cpu-µs/check (this process: callers, Store, go-redis), redis-script-µs/check (INFO
// commandstats: the script's own time) and redis-cpu-µs/check (the server's CPU, protocol
// included). On a machine where Redis and the benchmark share few cores, the Redis figures
// include time Redis spent preempted.
func BenchmarkStoreCheck(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("limits=%d", n), func(b *testing.B) {
			c := client(b)
			cfg, par := benchConfig()
			s := NewStoreWithConfig(c, cfg)
			defer s.Close()
			var id atomic.Int64
			// Checks wait on the network most of the time: a server has many in flight.
			b.SetParallelism(par)
			b.ReportAllocs()
			before := readRedisStats(b, c)
			cpu0 := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// One subject per goroutine, as distinct callers would be.
				req := []Request{{Limits: benchLimits(fmt.Sprintf("bench-%d-%d", n, id.Add(1)), n), Cost: 1}}
				ctx := context.Background()
				for pb.Next() {
					if _, err := s.Check(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N), "go-cpu-µs/check")
			reportRedis(b, before, readRedisStats(b, c), b.N)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

// BenchmarkStoreScript measures the script alone: one algorithm per sub-benchmark, 32 checks
// per pipeline (one call of the batch script) so that the Redis side dominates. Only the redis
// metrics are meaningful: Redis's time per check (INFO commandstats, over the script calls
// however many checks each carries) and its process CPU per check.
func BenchmarkStoreScript(b *testing.B) {
	cases := []struct {
		name string
		req  func(p string) Request
	}{
		{"token_bucket", func(p string) Request { return one(lim(p+":tb", algorithm.TokenBucket, 1<<40, time.Hour, 0), 1) }},
		{"gcra", func(p string) Request { return one(lim(p+":g", algorithm.GCRA, 1<<40, time.Hour, 0), 1) }},
		{"fixed_window", func(p string) Request { return one(lim(p+":fw", algorithm.FixedWindow, 1<<40, time.Hour, 0), 1) }},
		{"sliding_window_counter", func(p string) Request {
			return one(lim(p+":swc", algorithm.SlidingWindowCounter, 1<<40, time.Hour, 0), 1)
		}},
		{"leaky_bucket", func(p string) Request { return one(lim(p+":lb", algorithm.LeakyBucket, 1<<40, time.Hour, 0), 1) }},
		{"calendar_window", func(p string) Request {
			return one(calLimit(p+":cw", 1<<40, calendar.Period{Unit: calendar.Month}.Around(time.Now())), 1)
		}},
		{"sliding_window_log", func(p string) Request {
			return one(lim(p+":swl", algorithm.SlidingWindowLog, 1<<40, time.Second, 0), 1)
		}},
		{"mixed_3", func(p string) Request { return Request{Limits: benchLimits(p, 3), Cost: 1} }},
		{"token_bucket_idem", func(p string) Request {
			r := one(lim(p+":tbi", algorithm.TokenBucket, 1<<40, time.Hour, 0), 1)
			r.IdempotencyKey = p + ":idem"
			return r
		}},
		{"token_bucket_idem_fingerprint", func(p string) Request {
			r := one(lim(p+":tbf", algorithm.TokenBucket, 1<<40, time.Hour, 0), 1)
			r.IdempotencyKey = p + ":idem"
			r.Fingerprint = "0123456789abcdef" // the size of checker's
			return r
		}},
		{"peek_token_bucket", func(p string) Request { return peekReq(lim(p+":tb", algorithm.TokenBucket, 1<<40, time.Hour, 0)) }},
		{"balance_2_grants", func(p string) Request {
			return one(balLimit(p+":bl", 0, calendar.Period{Unit: calendar.Month}.Around(time.Now())), 1)
		}},
		{"balance_2_grants_3_thresholds", func(p string) Request {
			l := balLimit(p+":bl", 0, calendar.Period{Unit: calendar.Month}.Around(time.Now()))
			l.Thresholds = "p50,p80,p100"
			return one(l, 1)
		}},
		{"balance_2_grants_journaled", func(p string) Request {
			l := balLimit(p+":bl", 0, calendar.Period{Unit: calendar.Month}.Around(time.Now()))
			l.Journal = JournalArg("d1", "bench")
			return one(l, 1)
		}},
	}
	// The grants put on a case's balances: two, a plan's recurring one, then a top-up, as
	// BenchmarkDecideBalance burns them (without the token bucket beside them here).
	twoGrants := []Grant{{ID: "plan", Amount: 1 << 40, Priority: 1, Recurring: true}, {ID: "topup", Amount: 1 << 40, Priority: 2}}
	grantsOf := map[string][]Grant{"balance_2_grants": twoGrants, "balance_2_grants_3_thresholds": twoGrants, "balance_2_grants_journaled": twoGrants}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			s, c := newStore(b)
			const perCheck = 32 // requests per Check: one pipeline
			var seq atomic.Int64
			reqs := make([]Request, perCheck)
			ctx := context.Background()
			run := time.Now().UnixNano() // each round its own balances: grants add up
			for i := range reqs {
				reqs[i] = tc.req(fmt.Sprintf("{script-%s-%d-%d}", tc.name, run, i))
				for _, g := range grantsOf[tc.name] {
					l := reqs[i].Limits[0]
					if _, err := s.PutGrant(ctx, l.Key, g, l.Periods); err != nil {
						b.Fatal(err)
					}
				}
			}
			idem := strings.HasPrefix(tc.name, "token_bucket_idem") // a new key per call
			before := readRedisStats(b, c)
			b.ResetTimer()
			checks := 0
			for i := 0; i < b.N; i += perCheck {
				checks += perCheck
				if !idem {
					if _, err := s.Check(ctx, reqs); err != nil {
						b.Fatal(err)
					}
					continue
				}
				// A call has one idempotency record: one Check per request, all at once, so
				// that the batcher still sends them in one pipeline.
				var wg sync.WaitGroup
				for j := range reqs {
					r := reqs[j]
					r.IdempotencyKey = fmt.Sprintf("{script-%s-%d}:idem-%d", tc.name, j, seq.Add(1))
					wg.Go(func() {
						if _, err := s.Check(ctx, []Request{r}); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			after := readRedisStats(b, c)
			b.ReportMetric(float64(after.usec-before.usec)/float64(checks), "redis-script-µs/check")
			b.ReportMetric((after.cpu-before.cpu)*1e6/float64(checks), "redis-cpu-µs/check")
			b.ReportMetric(float64(after.calls-before.calls)/float64(checks), "script-calls/check")
		})
	}
}

// BenchmarkStoreLatency paces checks at fixed rates (about half of what BenchmarkStoreCheck
// reaches here before and after the batcher) from 64 goroutines and reports latency
// percentiles of Check and the rate achieved. It runs at least a second of load whatever b.N
// is.
func BenchmarkStoreLatency(b *testing.B) {
	for _, tc := range []struct {
		limits int
		rate   int // checks per second in total
	}{{1, 12500}, {1, 25000}, {3, 12500}} {
		b.Run(fmt.Sprintf("limits=%d/rate=%d", tc.limits, tc.rate), func(b *testing.B) {
			cfg, _ := benchConfig()
			s := NewStoreWithConfig(client(b), cfg)
			defer s.Close()
			const workers = 64
			total := max(b.N, tc.rate) // at least a second of load
			lat := make([]time.Duration, total)
			var next atomic.Int64
			start := time.Now()
			interval := time.Second / time.Duration(tc.rate)
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range workers {
				req := []Request{{Limits: benchLimits(fmt.Sprintf("lat-%d-%d-%d", tc.limits, tc.rate, w), tc.limits), Cost: 1}}
				wg.Go(func() {
					ctx := context.Background()
					for {
						i := next.Add(1) - 1
						if i >= int64(total) {
							return
						}
						due := start.Add(time.Duration(i) * interval)
						if d := time.Until(due); d > 0 {
							time.Sleep(d)
						}
						t0 := time.Now()
						if _, err := s.Check(ctx, req); err != nil {
							b.Error(err)
							return
						}
						// Measured from the call: a late timer is not the Store's delay. A
						// backlog would show as an achieved rate below the target.
						lat[i] = time.Since(t0)
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			elapsed := time.Since(start)
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
			b.ReportMetric(pct(0.5), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(float64(total)/elapsed.Seconds(), "checks/s")
		})
	}
}

func BenchmarkLocalCheck(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("limits=%d", n), func(b *testing.B) {
			loc := NewLocal(0)
			var id atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := Request{Limits: benchLimits(fmt.Sprintf("bench-%d", id.Add(1)), n), Cost: 1}
				now := time.Now()
				for pb.Next() {
					now = now.Add(time.Microsecond)
					loc.Check(now, req)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
