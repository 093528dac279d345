package checker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// Store keeps the buckets: *bucket.Store (Redis) in production. The engine calls it only
// through one guard, which bounds every call by Config.RedisTimeout, stops calling while the
// store is known to be unreachable (a circuit closed again by a probe), and then decides by each
// rule's fail mode.
type Store interface {
	// Check evaluates every request in one round trip and charges each allowed one; a request
	// with Peek set is evaluated without consuming anything (GetRemainingQuota, usage reports).
	Check(ctx context.Context, reqs []bucket.Request) ([]bucket.Result, error)
	// Delete removes keys (a reset) and returns how many existed.
	Delete(ctx context.Context, keys ...string) (int64, error)
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
}

var _ Store = (*bucket.Store)(nil)

// closedRetryAfter is what a fail_mode closed denial asks callers to wait: about one probe.
const closedRetryAfter = time.Second

// failModes tells, for limit j of request i, what decides it while the store cannot answer.
type failModes func(i, j int) rules.FailMode

// allLocal decides every limit with this process's own buckets.
func allLocal(int, int) rules.FailMode { return rules.FailLocal }

type guardConfig struct {
	timeout, probeEvery time.Duration
	localMaxKeys        int
	log                 *slog.Logger
	// observe records the duration of each store call (seconds).
	observe func(ctx context.Context, seconds float64, opts ...metric.RecordOption)
}

// guard is the one path to the store: timeout, circuit breaking and the local fallback.
type guard struct {
	guardConfig
	store   Store
	local   *bucket.Local
	down    atomic.Bool
	probing atomic.Bool
	closed  chan struct{}
	once    sync.Once
	probes  sync.WaitGroup
}

func newGuard(store Store, cfg guardConfig) *guard {
	if cfg.probeEvery <= 0 {
		cfg.probeEvery = 500 * time.Millisecond
	}
	return &guard{guardConfig: cfg, store: store, local: bucket.NewLocal(cfg.localMaxKeys), closed: make(chan struct{})}
}

// check evaluates reqs in the store. While the store cannot answer, each limit is decided by
// fail: open allows, closed denies for about a probe, local charges this process's buckets with
// the same algorithm; degraded then reports it. With fail nil there is no fallback: the error
// wraps ErrUnavailable. An error of the request or the script, which is a bug rather than an
// outage, is returned as is.
func (g *guard) check(ctx context.Context, reqs []bucket.Request, fail failModes) (results []bucket.Result, degraded bool, err error) {
	if g.down.Load() {
		if fail == nil {
			return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, errStoreDown)
		}
		return g.fallback(reqs, fail), true, nil
	}
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	start := time.Now()
	results, err = g.store.Check(cctx, reqs)
	g.observe(ctx, time.Since(start).Seconds())
	cancel()
	switch {
	case err == nil:
		return results, false, nil
	case ctx.Err() != nil:
		return nil, false, ctx.Err()
	case !unavailable(err):
		return nil, false, fmt.Errorf("bucket check: %w", err)
	}
	g.markDown(err)
	if fail == nil {
		return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return g.fallback(reqs, fail), true, nil
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
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	n, err := g.store.Delete(ctx, keys...)
	if err != nil {
		if unavailable(err) && ctx.Err() == nil {
			g.markDown(err)
		}
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return n, nil
}

// ping reports errStoreDown while the circuit is open or when the store does not answer.
func (g *guard) ping(ctx context.Context) error {
	if g.down.Load() {
		return errStoreDown
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if err := g.store.Ping(ctx); err != nil {
		g.markDown(err)
		return errStoreDown
	}
	return nil
}

// markDown opens the circuit: checks stop waiting for the store and use the rules' fail modes
// until a probe succeeds.
func (g *guard) markDown(err error) {
	if g.down.CompareAndSwap(false, true) {
		g.log.Warn("redis unreachable; deciding by fail mode until it answers", "err", err)
	}
	select {
	case <-g.closed:
		return
	default:
	}
	if g.probing.CompareAndSwap(false, true) {
		g.probes.Add(1)
		go g.probe()
	}
}

// probe pings the store until it answers, then closes the circuit. It clears probing before
// down so that a failure seen right after recovery always starts a new probe.
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
			g.down.Store(false)
			g.log.Info("redis reachable again; exact decisions resumed")
			return
		}
	}
}

// close stops the probe.
func (g *guard) close() {
	g.once.Do(func() { close(g.closed) })
	g.probes.Wait()
}

// unavailable tells a store that cannot answer now (network, deadline, or a Redis that is
// loading, busy, read-only or out of memory), where the fail modes decide, from an error of the
// request or the script, which is a bug to report rather than a reason to degrade.
func unavailable(err error) bool {
	if errors.Is(err, bucket.ErrInvalidRequest) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network, timeout, closed pool
	}
	for _, prefix := range []string{"LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOREPLICAS"} {
		if strings.HasPrefix(rerr.Error(), prefix) {
			return true
		}
	}
	return false
}
