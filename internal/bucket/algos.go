package bucket

import (
	"math"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// The algorithms for Local, with the formulas, rounding and float operations of the Lua
// files (see lua/*.lua for each contract), so that Local and Store agree on every number.
// Times are µs held in float64, as in Lua; every value stays below 2^53 and so exact.

// eps is the float slack that lets exactly-fitting costs through (lua/prelude.lua).
const eps = 1e-9

func tol(x float64) float64 {
	a := math.Abs(x)
	if a < 1 {
		a = 1
	}
	return a * eps
}

func le(a, b float64) bool          { return a <= b+tol(b) }
func floorT(x float64) float64      { return math.Floor(x + tol(x)) }
func ceilT(x float64) float64       { return math.Ceil(x - tol(x)) }
func ceilUS(x float64) float64      { return math.Ceil(x - 1e-3) } // absolute slack: see ceil_us
func nonneg(x float64) float64      { return math.Max(x, 0) }
func ttlUS(d float64) float64       { return math.Max(math.Ceil(d/1000), 1) * 1000 }
func windowID(t, w float64) float64 { return math.Floor(t / w) }

// params is one limit in the script's terms.
type params struct {
	limit, window, burst float64
	// queue is a queue's longest delay in µs (Limit.MaxDelay), 0 for none.
	queue float64
	// start, first and second are a algorithm.CalendarWindow's periods: the first's start and both
	// lengths, in µs.
	start, first, second float64
}

// paramsOf is l as the twins take it.
func paramsOf(l *Limit) params {
	p := params{limit: float64(l.Limit), window: float64(l.windowUS()), burst: float64(l.Capacity()), queue: float64(l.MaxDelay.Microseconds())}
	if l.Algorithm == algorithm.CalendarWindow {
		p.start = float64(l.Periods.Start.UnixMicro())
		p.first, p.second = float64(l.Periods.First.Microseconds()), float64(l.Periods.Second.Microseconds())
	}
	return p
}

// state is one bucket of Local. Which fields mean what depends on alg.
type state struct {
	alg algorithm.ID
	// expires is when the state becomes equivalent to a missing one (the Redis TTL).
	expires float64
	a, b    float64 // tb: tokens, cap; lb: level; swc: current, previous count
	t       float64 // tb, lb: last update; fw, swc: window id; gcra: TAT integer µs
	n       float64 // fw: count; gcra: TAT fraction in 1e-9 µs
	log     []logRun
}

// logRun is n units of a sliding window log charged at t.
type logRun struct{ t, n float64 }

// outcome is the evaluation of one limit: the before/after numbers of the reply and the state
// to commit.
type outcome struct {
	ok                  bool
	used, rem, reset    float64
	aused, arem, areset float64
	retry               float64
	next                state
}

// evaluate mirrors the Lua module's eval of alg; s is nil for a missing bucket. next is
// filled when ok, and for the window algorithms also when not (a counted denial commits it).
func evaluate(alg algorithm.ID, s *state, p params, now, cost float64) outcome {
	return evals[alg](s, p, now, cost)
}

// evals are the Go twins of the Lua modules' evals, for Local, indexed by algorithm (whose one
// table is package algorithm's): adding an algorithm adds its twin here. TestAlgorithmTable
// checks that every algorithm has one.
var evals = [...]func(s *state, p params, now, cost float64) outcome{
	algorithm.TokenBucket:          evalTokenBucket,
	algorithm.LeakyBucket:          evalLeakyBucket,
	algorithm.FixedWindow:          evalFixedWindow,
	algorithm.SlidingWindowLog:     evalSlidingLog,
	algorithm.SlidingWindowCounter: evalSlidingCounter,
	algorithm.GCRA:                 evalGCRA,
	algorithm.CalendarWindow:       evalCalendarWindow,
	algorithm.Concurrency:          evalConcurrency,
	algorithm.Balance:              nil, // remote: its grants live in Redis only
}

func evalTokenBucket(s *state, p params, now, cost float64) outcome {
	tk, t := p.burst, now
	if s != nil {
		tk = s.a
		if s.b != p.burst {
			tk = math.Min(math.Max(tk+(p.burst-s.b), 0), p.burst)
		}
		t = math.Max(now, s.t)
		tk = math.Min(tk+(t-s.t)*p.limit/p.window, p.burst)
	}
	fill := func(tk float64) (float64, float64, float64) {
		rem := nonneg(floorT(tk))
		return p.burst - rem, rem, t + (p.burst-tk)*p.window/p.limit
	}
	var o outcome
	o.used, o.rem, o.reset = fill(tk)
	if !le(cost, tk) {
		o.retry = ceilUS((cost - tk) * p.window / p.limit)
		return o
	}
	after := nonneg(tk - cost)
	o.ok = true
	o.aused, o.arem, o.areset = fill(after)
	o.next = state{alg: algorithm.TokenBucket, a: after, b: p.burst, t: t,
		expires: now + ttlUS(t-now+(p.burst-after)*p.window/p.limit)}
	return o
}

func evalLeakyBucket(s *state, p params, now, cost float64) outcome {
	lv, t := 0.0, now
	if s != nil {
		t = math.Max(now, s.t)
		lv = nonneg(s.a - (t-s.t)*p.limit/p.window)
	}
	meter := func(lv float64) (float64, float64, float64) {
		return nonneg(ceilT(lv)), nonneg(floorT(p.burst - lv)), t + lv*p.window/p.limit
	}
	var o outcome
	o.used, o.rem, o.reset = meter(lv)
	if !le(lv+cost, p.burst) && (p.queue <= 0 || !le((lv+cost-p.burst)*p.window/p.limit, p.queue)) {
		o.retry = ceilUS((lv+cost-p.burst)*p.window/p.limit - p.queue)
		return o
	}
	after := lv + cost
	o.ok = true
	o.aused, o.arem, o.areset = meter(after)
	o.next = state{alg: algorithm.LeakyBucket, a: after, t: t, expires: now + ttlUS(t-now+after*p.window/p.limit)}
	return o
}

func evalFixedWindow(s *state, p params, now, cost float64) outcome {
	wid, t, n := windowID(now, p.window), now, 0.0
	if s != nil && s.t >= wid {
		n = s.n
		if s.t > wid {
			wid, t = s.t, s.t*p.window
		}
	}
	return windowed(algorithm.FixedWindow, wid, (wid+1)*p.window, t, n, p, cost)
}

// windowed is the outcome of a window algorithm's check of cost in the window wid, which holds
// n and ends at reset; a denial waits from t until reset.
func windowed(alg algorithm.ID, wid, reset, t, n float64, p params, cost float64) outcome {
	o := outcome{used: n, rem: nonneg(p.limit - n), reset: reset}
	after := n + cost
	// A denial's next is the as-if-charged state, which a counted request commits (Count).
	o.next = state{alg: alg, t: wid, n: after, expires: math.Ceil(reset/1000) * 1000}
	if after > p.limit {
		o.retry = reset - t
		return o
	}
	o.ok = true
	o.aused, o.arem, o.areset = after, nonneg(p.limit-after), reset
	return o
}

// evalCalendarWindow is lua/calendar_window.lua's eval. The window id is the period's start
// (µs here, seconds in Redis). A time outside both periods (a clock off by half a period or
// more) is decided in the nearer of them.
func evalCalendarWindow(s *state, p params, now, cost float64) outcome {
	wid, reset := p.start, p.start+p.first
	if now >= reset {
		wid, reset = reset, reset+p.second
	}
	n := 0.0
	if s != nil && s.t >= wid {
		n = s.n
		wid = s.t
	}
	return windowed(algorithm.CalendarWindow, wid, reset, now, n, p, cost)
}

// evalConcurrency is lua/concurrency.lua's eval, for Local, which has no releases: each charge
// is a lease held for the whole window (the log's runs, by their expiry), which errs towards
// denying.
func evalConcurrency(s *state, p params, now, cost float64) outcome {
	var live []logRun
	n, last, first := 0.0, now, 0.0
	if s != nil {
		for _, r := range s.log {
			if r.t > now {
				live = append(live, r)
				n++
				last = math.Max(last, r.t)
				if first == 0 || r.t < first {
					first = r.t
				}
			}
		}
	}
	o := outcome{used: n, rem: nonneg(p.limit - n), reset: last}
	if n+1 > p.limit {
		o.retry = first - now
		return o
	}
	o.ok = true
	o.aused, o.arem, o.areset = n+1, nonneg(p.limit-n-1), math.Max(last, now+p.window)
	o.next = state{alg: algorithm.Concurrency, log: append(live, logRun{t: now + p.window, n: 1}), expires: o.areset}
	return o
}

func evalSlidingCounter(s *state, p params, now, cost float64) outcome {
	W, L := p.window, p.limit
	wid, t, c, pv := windowID(now, W), now, 0.0, 0.0
	if s != nil {
		switch {
		case s.t >= wid:
			c, pv = s.a, s.b
			if s.t > wid {
				wid, t = s.t, s.t*W
			}
		case s.t == wid-1:
			pv = s.a
		}
	}
	pos := (t - wid*W) / W
	view := func(c float64) (used, rem, reset, weighted float64) {
		weighted = pv*(1-pos) + c
		reset = t
		if c > 0 {
			reset = (wid + 2) * W
		} else if pv > 0 {
			reset = (wid + 1) * W
		}
		return nonneg(ceilT(weighted)), nonneg(floorT(L - weighted)), reset, weighted
	}
	var o outcome
	var weighted float64
	o.used, o.rem, o.reset, weighted = view(c)
	if le(weighted+cost, L) {
		o.ok = true
		o.aused, o.arem, o.areset, _ = view(c + cost)
		o.next = state{alg: algorithm.SlidingWindowCounter, t: wid, a: c + cost, b: pv,
			expires: math.Ceil((wid+2)*W/1000) * 1000}
		return o
	}
	target := L - cost
	var at float64
	switch {
	case le(c+cost, L) && pv > 0:
		at = wid*W + W*(1-(target-c)/pv)
	case target >= 0 && c > 0:
		at = (wid+1)*W + W*(1-target/c)
	default:
		at = o.reset
	}
	o.retry = ceilUS(at - t)
	return o
}

func evalSlidingLog(s *state, p params, now, cost float64) outcome {
	W, L := p.window, p.limit
	t := now
	var log []logRun
	if s != nil && len(s.log) > 0 {
		log = s.log
		if last := log[len(log)-1].t; last > t {
			t = last
		}
	}
	// Live runs are those after t - W; log is oldest first.
	first := len(log)
	count := 0.0
	for i := len(log) - 1; i >= 0 && log[i].t > t-W; i-- {
		first = i
		count += log[i].n
	}
	live := log[first:]
	reset := t
	if count > 0 {
		reset = live[len(live)-1].t + W
	}
	o := outcome{used: count, rem: nonneg(L - count), reset: reset}
	if count+cost > L {
		k := count + cost - L
		if k <= count {
			for _, r := range live {
				if k <= r.n {
					o.retry = r.t + W - t
					break
				}
				k -= r.n
			}
		} else {
			o.retry = reset - t
		}
		return o
	}
	o.ok = true
	o.aused, o.arem, o.areset = count+cost, nonneg(L-count-cost), t+W
	// The log itself is extended by apply: eval must not touch the shared state.
	o.next = state{alg: algorithm.SlidingWindowLog, t: t, n: cost, expires: now + ttlUS(t+W-now)}
	return o
}

// apply commits o, the allowed evaluation of one limit, to s. A sliding window log drops its
// expired runs and appends the charge; every other state is replaced whole.
func (s *state) apply(o *outcome, p params) {
	if o.next.alg != algorithm.SlidingWindowLog {
		*s = o.next
		return
	}
	t, cost := o.next.t, o.next.n
	log := s.log
	if s.alg != algorithm.SlidingWindowLog {
		log = log[:0]
	}
	i := 0
	for i < len(log) && log[i].t <= t-p.window {
		i++
	}
	log = append(log[:0], log[i:]...)
	if n := len(log); n > 0 && log[n-1].t == t {
		log[n-1].n += cost
	} else {
		log = append(log, logRun{t: t, n: cost})
	}
	*s = state{alg: algorithm.SlidingWindowLog, expires: o.next.expires, log: log}
}

func evalGCRA(s *state, p params, now, cost float64) outcome {
	T := p.window / p.limit
	tau := p.burst * T
	diff := 0.0
	if s != nil {
		diff = nonneg((s.t - now) + s.n/1e9)
	}
	view := func(diff float64) (float64, float64, float64) {
		rem := math.Min(nonneg(floorT((tau-diff)/T)), p.burst)
		return p.burst - rem, rem, now + diff
	}
	nd := diff + cost*T
	var o outcome
	o.used, o.rem, o.reset = view(diff)
	if !le(nd, tau+p.queue) {
		o.retry = ceilUS(nd - tau - p.queue)
		return o
	}
	o.ok = true
	o.aused, o.arem, o.areset = view(nd)
	ip := math.Floor(nd)
	f9 := math.Floor((nd-ip)*1e9 + 0.5)
	if f9 >= 1e9 {
		ip, f9 = ip+1, 0
	}
	o.next = state{alg: algorithm.GCRA, t: now + ip, n: f9, expires: now + ttlUS(nd)}
	return o
}
