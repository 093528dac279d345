package checker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
)

// bucketStore keeps the buckets: *bucket.Store (Redis) in production, a wrapper that injects
// faults in this package's tests (Config.store). The engine calls it only through one guard, which bounds every call by Config.RedisTimeout, stops calling while the
// store is known to be unreachable (a circuit closed again by a probe), and then decides by each
// rule's fail mode.
type bucketStore interface {
	// Send starts the evaluation of every request, in one round trip, charging each allowed
	// one; its Pending's Wait returns the results. A request with Peek set is evaluated without
	// consuming anything (GetRemainingQuota, usage reports). A request whose IdempotencyKey is
	// bound to another Fingerprint fails the call with an error wrapping
	// ErrIdempotencyConflict, charging nothing. *bucket.Store queues the calls of many checks
	// to leave together without a goroutine each (a batch's); a store that answers at once
	// returns bucket.Done.
	Send(ctx context.Context, reqs []bucket.Request) bucket.Pending
	// Delete removes keys (a reset) and returns how many existed.
	Delete(ctx context.Context, keys ...string) (int64, error)
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
}

var _ bucketStore = (*bucket.Store)(nil)

// closedRetryAfter is what a fail_mode closed denial asks callers to wait: about one probe.
const closedRetryAfter = time.Second

// failModes tells, for limit j of request i, what decides it while the store cannot answer.
type failModes func(i, j int) rules.FailMode

// allLocal decides every limit with this process's own buckets.
func allLocal(int, int) rules.FailMode { return rules.FailLocal }

type guardConfig struct {
	timeout, probeEvery time.Duration
	localMaxKeys        int
	// circuitFailures is the circuit's threshold (0: defaultCircuitFailures).
	circuitFailures int
	// maxInFlight bounds the calls with a fail mode waiting for the store (<= 0: no bound).
	maxInFlight int64
	log         *slog.Logger
	// observe records the duration of each store call (seconds).
	observe func(ctx context.Context, seconds float64, opts ...metric.RecordOption)
	// shed counts a call answered by fail mode because maxInFlight were waiting.
	shed func(ctx context.Context, n int64, opts ...metric.AddOption)
}

// guard is the one path to the store: timeout, circuit breaking and the local fallback.
type guard struct {
	guardConfig
	store bucketStore
	// reported: the store tells the circuit the outcome of its own round trips
	// (bucket.StoreConfig.OnRoundTrip), so the guard does not count what its checks see: a
	// check's timeout includes its time queued in this process.
	reported bool
	circuit  *circuit
	local    *bucket.Local
	// inFlight counts the calls with a fail mode between the bound and the store's answer.
	inFlight atomic.Int64
	// outage is the circuit's current opening (Engine.Outage); stale while it is closed.
	outage  atomic.Pointer[Outage]
	probing atomic.Bool
	closed  chan struct{}
	// mu orders starting a probe (opened, called from the store's batch loops, which may
	// outlive close by a batch) against close, so that no probe starts after close waited.
	mu       sync.Mutex
	isClosed bool
	probes   sync.WaitGroup
}

// newGuard returns a guard without a store: use sets it, once the store could be given the
// guard's circuit to report to.
func newGuard(cfg guardConfig) *guard {
	if cfg.probeEvery <= 0 {
		cfg.probeEvery = 500 * time.Millisecond
	}
	g := &guard{guardConfig: cfg, local: bucket.NewLocal(cfg.localMaxKeys), closed: make(chan struct{})}
	g.circuit = newCircuit(cfg.circuitFailures, cfg.timeout, g.opened)
	return g
}

// use makes store the guarded store; reported says that it reports its round trips to
// g.circuit.record.
func (g *guard) use(store bucketStore, reported bool) {
	g.store, g.reported = store, reported
}

// check evaluates reqs in the store. A check that the store does not answer within the timeout,
// or answers with an outage (Redis's error, its connection), has each limit decided by fail:
// open allows, closed denies for about a probe, local charges this process's buckets with the
// same algorithm; degraded then reports it. While the circuit is open, checks do not call the
// store at all. With fail nil there is no fallback: the error wraps ErrUnavailable.
//
// The check's outcome counts towards the circuit only for a store passed in (Config.store). The default store
// reports the outcomes of its round trips itself, which tell Redis failing from this process
// being slow to read the replies: a check that waited its timeout queued behind a burst, or
// starved of CPU, is decided by its fail mode, but Redis did not fail. A check whose own ctx
// ends first returns ctx's error: the caller gave up, which says nothing of the store and is
// neither counted nor answered by a fail mode. An error of the request or of the script (a
// malformed reply, a script error), which is a bug rather than an outage, is returned as is: it
// fails this check only.
func (g *guard) check(ctx context.Context, reqs []bucket.Request, fail failModes) (results []bucket.Result, degraded bool, err error) {
	d := deadline{parent: ctx}
	defer d.release()
	c := g.send(ctx, d.of(g), reqs, fail)
	return g.wait(&c)
}

// deadline is the guard's timeout on the store calls of a check, or of a batch of checks,
// which share one: made by the first call that needs it, since a check answered without the
// store needs none. release it once every call is waited for.
type deadline struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
}

func (d *deadline) of(g *guard) context.Context {
	if d.ctx == nil {
		d.ctx, d.cancel = context.WithTimeout(d.parent, g.timeout)
	}
	return d.ctx
}

func (d *deadline) release() {
	if d.cancel != nil {
		d.cancel()
	}
}

// storeCall is a check's store call between guard.send and guard.wait.
type storeCall struct {
	ctx     context.Context // the caller's
	reqs    []bucket.Request
	fail    failModes
	start   time.Time
	pending bucket.Pending // the call, unless known
	holds   bool           // it holds a place of the guard's inFlight
	// known: results, degraded and err are the answer, which send knew (the circuit is open,
	// or the call was shed).
	known    bool
	results  []bucket.Result
	degraded bool
	err      error
}

// send starts the store call of a check (ctx, the caller's context; bctx, its deadline's) for
// wait to finish: check split in two, so that a batch's checks are all sent before the
// first is waited for.
func (g *guard) send(ctx, bctx context.Context, reqs []bucket.Request, fail failModes) storeCall {
	c := storeCall{ctx: ctx, reqs: reqs, fail: fail, known: true}
	if g.circuit.open() {
		if fail == nil {
			c.err = fmt.Errorf("%w: %w", ErrUnavailable, errStoreDown)
			return c
		}
		c.results, c.degraded = g.fallback(reqs, fail), true
		return c
	}
	if fail != nil && g.maxInFlight > 0 {
		if g.inFlight.Add(1) > g.maxInFlight {
			g.inFlight.Add(-1)
			// Not a round trip: the circuit hears nothing of it, as Redis did not fail.
			g.shed(ctx, 1)
			c.results, c.degraded = g.fallback(reqs, fail), true
			return c
		}
		c.holds = true
	}
	c.start = time.Now()
	c.pending, c.known = g.store.Send(bctx, reqs), false
	return c
}

// wait finishes c, the call send started, as check describes.
func (g *guard) wait(c *storeCall) (results []bucket.Result, degraded bool, err error) {
	if c.known {
		return c.results, c.degraded, c.err
	}
	results, err = c.pending.Wait()
	g.observe(c.ctx, time.Since(c.start).Seconds())
	if c.holds {
		g.inFlight.Add(-1)
	}
	ctx, reqs, fail := c.ctx, c.reqs, c.fail
	switch {
	case err == nil:
		if !g.reported {
			g.circuit.record(nil)
		}
		return results, false, nil
	case callerGone(ctx):
		return nil, false, fmt.Errorf("bucket check: %w", callerErr(ctx))
	case !bucket.Unavailable(err):
		return nil, false, fmt.Errorf("bucket check: %w", err)
	}
	if !g.reported {
		g.circuit.record(err)
	}
	if fail == nil {
		return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return g.fallback(reqs, fail), true, nil
}

// callerGone reports whether ctx, the caller's, has ended or reached its deadline: a socket
// deadline set from it can fire a moment before its timer does.
func callerGone(ctx context.Context) bool { return callerErr(ctx) != nil }

// callerErr is why ctx, the caller's, has ended, or nil while it has not: context.Cause once it
// has, and context.DeadlineExceeded in the moment its deadline has passed but its timer has not
// yet fired (a socket deadline set from it can fire first), so that the error is never nil.
func callerErr(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// fallback decides reqs limit by limit by their fail modes.
func (g *guard) fallback(reqs []bucket.Request, fail failModes) []bucket.Result {
	now := time.Now()
	results := make([]bucket.Result, len(reqs))
	for i := range reqs {
		req := &reqs[i]
		res := &results[i]
		res.Now, res.Allowed = now, true
		res.Limits = make([]bucket.LimitResult, len(req.Limits))
		var local bucket.Request
		var idx []int
		for j, lim := range req.Limits {
			switch fail(i, j) {
			case rules.FailClosed:
				res.Limits[j] = bucket.LimitResult{RetryAfter: closedRetryAfter, ResetAt: now.Add(closedRetryAfter)}
			case rules.FailLocal:
				local.Limits = append(local.Limits, lim)
				idx = append(idx, j)
				continue
			default:
				res.Limits[j] = bucket.LimitResult{Allowed: true, Remaining: lim.Capacity(), ResetAt: now}
			}
		}
		if len(idx) > 0 {
			local.Cost, local.Peek = req.Cost, req.Peek
			lr := g.local.Check(now, local)
			for k, l := range lr.Limits {
				res.Limits[idx[k]] = l
			}
		}
		for _, l := range res.Limits {
			res.Allowed = res.Allowed && l.Allowed
		}
	}
	return results
}

// delete removes keys within the timeout; there is no fallback.
func (g *guard) delete(ctx context.Context, keys []string) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	n, err := g.store.Delete(cctx, keys...)
	if err != nil {
		if bucket.Unavailable(err) && !callerGone(ctx) {
			g.circuit.record(err)
		}
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return n, nil
}

// ping reports errStoreDown while the circuit is open or when the store does not answer. A
// ping is a round trip of its own: its outcome counts like a check's.
func (g *guard) ping(ctx context.Context) error {
	if g.circuit.open() {
		return errStoreDown
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	err := g.store.Ping(cctx)
	switch {
	case err == nil:
		g.circuit.record(nil)
		return nil
	case callerGone(ctx):
		return callerErr(ctx)
	}
	g.circuit.record(err)
	return fmt.Errorf("%w: %w", errStoreDown, err)
}

// opened is the circuit's news that it opened: checks stop waiting for the store and use the
// rules' fail modes until a probe succeeds.
func (g *guard) opened(err error) {
	g.log.Warn("redis unreachable; deciding by fail mode until it answers",
		"err", err, "failures_in_a_row", g.circuit.threshold)
	g.outage.Store(&Outage{Since: time.Now(), Err: err})
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isClosed && g.probing.CompareAndSwap(false, true) {
		g.probes.Add(1)
		go g.probe()
	}
}

// probe pings the store until it answers, then closes the circuit. It clears probing before
// closing the circuit so that a failure seen right after recovery always starts a new probe.
func (g *guard) probe() {
	defer g.probes.Done()
	t := time.NewTicker(g.probeEvery)
	defer t.Stop()
	// Loading the script is the probe where the store has one: Redis answers, and the first
	// checks after a restart find the script cached instead of each paying NOSCRIPT and a compile.
	ping := g.store.Ping
	if l, ok := g.store.(interface{ LoadScript(context.Context) error }); ok {
		ping = l.LoadScript
	}
	for {
		select {
		case <-g.closed:
			g.probing.Store(false)
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
		err := ping(ctx)
		cancel()
		if err == nil {
			g.probing.Store(false)
			g.outage.Store(nil)
			g.circuit.close()
			g.log.Info("redis reachable again; exact decisions resumed")
			return
		}
	}
}

// close stops the probe.
func (g *guard) close() {
	g.mu.Lock()
	if !g.isClosed {
		g.isClosed = true
		close(g.closed)
	}
	g.mu.Unlock()
	g.probes.Wait()
}
