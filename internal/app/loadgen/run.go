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
	if err := cfg.validate(); err != nil {
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
	ids := make([]string, cfg.Keys)
	for i := range ids {
		ids[i] = cfg.KeyPrefix + strconv.Itoa(i)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	warm, measured := &stats{}, &stats{}
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	end := measureFrom.Add(cfg.Duration)
	var (
		sent    atomic.Int64 // open loop: measured slots sent
		workers sync.WaitGroup
		slots   chan time.Time // open loop: due times, from pace
	)
	perCall := max(cfg.Batch, 1) // checks per call
	interval := 0.0
	if cfg.Rate > 0 {
		interval = float64(time.Second) * float64(perCall) / cfg.Rate
		slots = make(chan time.Time, cfg.Concurrency)
		go pace(runCtx, start, end, interval, slots)
	}
	seed := uint64(time.Now().UnixNano())
	for w := 0; w < cfg.Concurrency; w++ {
		workers.Add(1)
		call := newCall()
		picker, _ := newKeyPicker(cfg.Distribution, cfg.Keys, seed+uint64(w)) // validated by Run
		batch := make([]string, perCall)
		go func() {
			defer workers.Done()
			for {
				var from time.Time // what latency counts from
				if slots != nil {
					at, ok := <-slots
					if !ok {
						return
					}
					from = at
				} else if from = time.Now(); !from.Before(end) || runCtx.Err() != nil {
					return
				}
				st := measured
				if from.Before(measureFrom) {
					st = warm
				} else if slots != nil {
					sent.Add(1)
				}
				for i := range batch {
					batch[i] = ids[picker.next()]
				}
				cctx, ccancel := context.WithTimeout(runCtx, cfg.Timeout)
				a, err := call(cctx, batch)
				ccancel()
				if err != nil && ended(ctx) {
					return // interrupted: not the target's error
				}
				st.done(a, len(batch)-a.allowed-a.denied, err, time.Since(from))
				if err != nil && slots == nil && !retry.Sleep(runCtx, errorPause) {
					return
				}
			}
		}()
	}
	stopProgress := startProgress(cfg.Progress, start, measureFrom, warm, measured)
	workers.Wait()
	finished := time.Now()
	stopProgress()

	rep := &Report{
		Protocol: string(cfg.Protocol), Mode: "closed", Concurrency: cfg.Concurrency, Rate: cfg.Rate, Batch: cfg.Batch, Keys: cfg.Keys,
		Distribution: string(cfg.Distribution), Interrupted: ctx.Err() != nil,
		Allowed: measured.allowed.Load(), Denied: measured.denied.Load(), Errors: measured.errors.Load(),
		Degraded: measured.degraded.Load(), DegradedDenied: measured.degradedDenied.Load(),
		ErrorSamples: measured.samples,
		cfg:          *cfg,
	}
	rep.Checks = rep.Allowed + rep.Denied + rep.Errors
	if elapsed := finished.Sub(measureFrom); elapsed > 0 {
		rep.DurationS = round3(elapsed.Seconds())
		rep.ChecksPerSec = round3(float64(rep.Allowed+rep.Denied) / elapsed.Seconds())
	}
	if cfg.Rate > 0 {
		rep.Mode = "open"
		if due := slotsBefore(start, end, interval) - slotsBefore(start, measureFrom, interval); !rep.Interrupted && due > sent.Load() {
			rep.Missed = uint64(due-sent.Load()) * uint64(perCall)
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
