package loadgen

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"
)

// errorPause is how long a closed-loop worker waits after an error, so that a target that
// refuses connections does not turn the generator into a busy loop.
const errorPause = 10 * time.Millisecond

// Run puts load on cfg.Target and returns what was measured. It returns at the end of
// cfg.Warmup+cfg.Duration once the checks in flight are answered (each is bounded by
// cfg.Timeout), or as soon as ctx is done, with what was measured until then and
// Report.Interrupted set.
//
// A check that fails is counted in the report, not returned: Run's only errors are
// *ConfigError.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	newCall, closeTarget, err := newTarget(&cfg)
	if err != nil {
		return nil, err
	}
	defer closeTarget()
	return run(ctx, &cfg, newCall), nil
}

// run is Run with a valid cfg and its target's calls.
func run(ctx context.Context, cfg *Config, newCall func() call) *Report {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newRunner(cfg)
	if cfg.Rate > 0 {
		r.interval = float64(time.Second) * float64(r.perCall) / cfg.Rate
		r.slots = make(chan time.Time, cfg.Concurrency)
		go pace(runCtx, r.start, r.end, r.interval, r.slots)
	}
	seed := uint64(time.Now().UnixNano())
	var workers sync.WaitGroup
	for w := 0; w < cfg.Concurrency; w++ {
		call := newCall()
		picker, _ := newKeyPicker(cfg.Distribution, cfg.Keys, seed+uint64(w)) // validated by Run
		workers.Go(func() { r.work(ctx, runCtx, call, picker) })
	}
	stopProgress := startProgress(cfg.Progress, r.start, r.measureFrom, r.warm, r.measured)
	workers.Wait()
	finished := time.Now()
	stopProgress()
	return r.report(ctx, finished)
}

// runner is what a run's workers share: the subjects, the schedule and the two tallies, of
// the warm-up and of the measured part.
type runner struct {
	cfg                     *Config
	ids                     []string
	start, measureFrom, end time.Time
	perCall                 int            // checks per call
	interval                float64        // open loop: nanoseconds between slots
	slots                   chan time.Time // open loop: due times, from pace
	sent                    atomic.Int64   // open loop: measured slots sent
	warm, measured          *stats
}

func newRunner(cfg *Config) *runner {
	ids := make([]string, cfg.Keys)
	for i := range ids {
		ids[i] = cfg.KeyPrefix + strconv.Itoa(i)
	}
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	return &runner{cfg: cfg, ids: ids, start: start, measureFrom: measureFrom, end: measureFrom.Add(cfg.Duration),
		perCall: max(cfg.Batch, 1), warm: &stats{}, measured: &stats{}}
}

// work is one worker: it sends calls, at the open loop's slots or one after another, until
// the run ends or ctx (the caller's) is done; runCtx ends the run's calls with it.
func (r *runner) work(ctx, runCtx context.Context, call call, picker *keyPicker) {
	batch := make([]string, r.perCall)
	for {
		var from time.Time // what latency counts from
		if r.slots != nil {
			at, ok := <-r.slots
			if !ok {
				return
			}
			from = at
		} else if from = time.Now(); !from.Before(r.end) || runCtx.Err() != nil {
			return
		}
		st := r.measured
		if from.Before(r.measureFrom) {
			st = r.warm
		} else if r.slots != nil {
			r.sent.Add(1)
		}
		for i := range batch {
			batch[i] = r.ids[picker.next()]
		}
		cctx, ccancel := context.WithTimeout(runCtx, r.cfg.Timeout)
		a, err := call(cctx, batch)
		ccancel()
		if err != nil && ended(ctx) {
			return // interrupted: not the target's error
		}
		st.done(a, len(batch)-a.allowed-a.denied, err, time.Since(from))
		if err != nil && r.slots == nil && !retry.Sleep(runCtx, errorPause) {
			return
		}
	}
}

// report is what the run measured, finished at finished; ctx done means it was interrupted.
func (r *runner) report(ctx context.Context, finished time.Time) *Report {
	cfg, measured := r.cfg, r.measured
	rep := &Report{
		Protocol: string(cfg.Protocol), Mode: "closed", Concurrency: cfg.Concurrency, Rate: cfg.Rate, Batch: cfg.Batch, Keys: cfg.Keys,
		Distribution: string(cfg.Distribution), Interrupted: ctx.Err() != nil,
		Allowed: measured.allowed.Load(), Denied: measured.denied.Load(), Errors: measured.errors.Load(),
		Degraded: measured.degraded.Load(), DegradedDenied: measured.degradedDenied.Load(),
		ErrorSamples: measured.samples,
		cfg:          *cfg,
	}
	rep.Checks = rep.Allowed + rep.Denied + rep.Errors
	if elapsed := finished.Sub(r.measureFrom); elapsed > 0 {
		rep.DurationS = round3(elapsed.Seconds())
		rep.ChecksPerSec = round3(float64(rep.Allowed+rep.Denied) / elapsed.Seconds())
	}
	if cfg.Rate > 0 {
		rep.Mode = "open"
		due := slotsBefore(r.start, r.end, r.interval) - slotsBefore(r.start, r.measureFrom, r.interval)
		if !rep.Interrupted && due > r.sent.Load() {
			rep.Missed = uint64(due-r.sent.Load()) * uint64(r.perCall)
		}
	}
	h := &measured.hist
	rep.P50Ms, rep.P90Ms, rep.P99Ms, rep.P999Ms = h.quantileMs(0.5), h.quantileMs(0.9), h.quantileMs(0.99), h.quantileMs(0.999)
	rep.MaxMs, rep.MeanMs = round3(float64(h.max.Load())/1000), h.meanMs()
	return rep
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// ended reports whether ctx is done or past its deadline. A call's context inherits ctx's
// deadline with a timer of its own, which may fire before ctx's: the call then fails with
// DeadlineExceeded while ctx.Err() is still nil, and would be counted as the target's error.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
