// Package checker is quotaflow's decision service: it answers "may this request go ahead?" from
// buckets kept in Redis, over Connect, gRPC, gRPC-Web and a plain HTTP forward-auth endpoint on
// one port. It is stateless: every checker process shares the buckets in Redis, so any number
// of them give one exact answer.
package checker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// Config configures a Server. The zero value is usable: it talks to Redis on 127.0.0.1:6379
// and is not ready until rules are set.
type Config struct {
	// Redis is the client for the buckets; nil means a client for 127.0.0.1:6379, closed by
	// Server.Close. A client passed in is left open. It must have ContextTimeoutEnabled set,
	// else go-redis ignores RedisTimeout and a stalled Redis stalls every check.
	Redis redis.UniversalClient
	// Rules is the rule set to enforce; nil means none yet (checks answer Unavailable and
	// readiness is false until SetRules).
	Rules *rules.Set
	// RedisTimeout bounds every Redis call of a check; after it the rules' fail modes decide.
	// 0 means 50ms.
	RedisTimeout time.Duration
	// ProbeInterval is how often an unreachable Redis is probed; while it is unreachable, checks
	// do not wait for it. 0 means 500ms.
	ProbeInterval time.Duration
	// LocalMaxKeys bounds the in-process buckets of fail_mode local rules; 0 means 1M.
	LocalMaxKeys int
	// Decisions receives every decision (nil: decisions are not published).
	Decisions DecisionSink
	// InstanceID identifies this checker process in decision ids and events; empty means a
	// random one.
	InstanceID string
	// DisableOverLimitCache turns off the local cache of buckets known to deny until a known
	// instant (see overLimitCache): every check then goes to Redis.
	DisableOverLimitCache bool
	// Meter and Tracer receive the checker's metrics and spans; nil means none.
	Meter  metric.Meter
	Tracer trace.Tracer
	// TraceRatio is the share of checks traced when Tracer is set; 0 means all.
	TraceRatio float64
	// Logger receives the checker's logs; nil means slog.Default().
	Logger *slog.Logger
	// Admin configures the admin REST API under /api/v1 (rules, tiers, overrides).
	Admin AdminConfig
}

// Server decides checks. Its methods are safe for concurrent use.
type Server struct {
	log          *slog.Logger
	rdb          redis.UniversalClient
	ownsRedis    bool
	store        *bucket.Store
	local        *bucket.Local
	timeout      time.Duration
	probeEvery   time.Duration
	rules        atomic.Pointer[rules.Set]
	redisDown    atomic.Bool
	probing      atomic.Bool
	closed       chan struct{}
	closeOnce    sync.Once
	probeStopped sync.WaitGroup
	sink         DecisionSink
	instanceID   string
	decisionSeq  atomic.Uint64
	olc          *overLimitCache // nil when disabled
	tel          *instruments
	admin        *admin
}

// New returns a Server for cfg. It does not contact Redis: an unreachable Redis is a degraded
// state, not a start-up failure.
func New(cfg Config) *Server {
	s := &Server{
		log:        cfg.Logger,
		rdb:        cfg.Redis,
		timeout:    cfg.RedisTimeout,
		probeEvery: cfg.ProbeInterval,
		local:      bucket.NewLocal(cfg.LocalMaxKeys),
		closed:     make(chan struct{}),
		sink:       cfg.Decisions,
		instanceID: cfg.InstanceID,
	}
	if s.instanceID == "" {
		s.instanceID = newInstanceID()
	}
	if !cfg.DisableOverLimitCache {
		s.olc = newOverLimitCache(0)
	}
	var err error
	if s.tel, err = newInstruments(cfg.Meter, cfg.Tracer, cfg.TraceRatio); err != nil {
		s.log.Error("metrics disabled: creating instruments failed", "err", err)
		s.tel, _ = newInstruments(nil, cfg.Tracer, cfg.TraceRatio)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "checker")
	if s.rdb == nil {
		s.rdb = redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
		s.ownsRedis = true
	}
	if c, ok := s.rdb.(*redis.Client); ok && !c.Options().ContextTimeoutEnabled {
		s.log.Warn("redis client has ContextTimeoutEnabled off: the Redis deadline of checks cannot be enforced")
	}
	if s.timeout <= 0 {
		s.timeout = 50 * time.Millisecond
	}
	if s.probeEvery <= 0 {
		s.probeEvery = 500 * time.Millisecond
	}
	// A batch carries checks that each wait at most RedisTimeout: its own deadline is the same.
	s.store = bucket.NewStoreWithConfig(s.rdb, bucket.StoreConfig{BatchTimeout: s.timeout})
	if cfg.Rules != nil {
		s.rules.Store(cfg.Rules)
	}
	s.admin = newAdmin(s, cfg.Admin)
	return s
}

// SetRules swaps the enforced rule set atomically; checks in flight finish with the old one.
// Buckets are keyed by subject, algorithm, window and endpoint pattern, so a rule whose limit
// changes keeps what its subjects consumed.
func (s *Server) SetRules(set *rules.Set) {
	s.rules.Store(set)
	if s.olc != nil {
		s.olc.clear() // a raised limit must not be denied from the cache
	}
}

// InstanceID identifies this checker in decision ids and events.
func (s *Server) InstanceID() string { return s.instanceID }

// Rules returns the enforced rule set (nil before any was set).
func (s *Server) Rules() *rules.Set { return s.rules.Load() }

// Close stops background work (the Redis batch loops, the probe) and closes the Redis client if
// the Server made it. Checks must not be in flight.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	s.probeStopped.Wait()
	err := s.store.Close() // stops the batch loops
	if s.ownsRedis {
		err = errors.Join(err, s.rdb.Close())
	}
	return err
}

// Ready reports why the server cannot serve exact decisions, or nil when it can: rules are
// loaded and Redis answers.
func (s *Server) Ready(ctx context.Context) error {
	if s.rules.Load() == nil {
		return errNoRules
	}
	if s.redisDown.Load() {
		return errRedisDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.markRedisDown(err)
		return errRedisDown
	}
	return nil
}

var (
	errNoRules   = errors.New("no rules loaded")
	errRedisDown = errors.New("redis unreachable: decisions are degraded to each rule's fail mode")
	// errRedisUnavailable is an operation that needs Redis and has no fail mode (a reset).
	errRedisUnavailable = errors.New("redis unavailable")
)

// markRedisDown opens the circuit: checks stop waiting for Redis and use the rules' fail
// modes until a probe succeeds.
func (s *Server) markRedisDown(err error) {
	if s.redisDown.CompareAndSwap(false, true) {
		s.log.Warn("redis unreachable; deciding by fail mode until it answers", "err", err)
	}
	select {
	case <-s.closed:
		return
	default:
	}
	if s.probing.CompareAndSwap(false, true) {
		s.probeStopped.Add(1)
		go s.probe()
	}
}

// probe pings Redis until it answers, then closes the circuit. It clears probing before
// redisDown so that a failure seen right after recovery always starts a new probe.
func (s *Server) probe() {
	defer s.probeStopped.Done()
	t := time.NewTicker(s.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			s.probing.Store(false)
			return
		case <-t.C:
		}
		// Loading the script is the probe: Redis answers, and the first checks after a restart
		// find the script cached instead of each paying NOSCRIPT and a compile.
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		err := s.store.LoadScript(ctx)
		cancel()
		if err == nil {
			s.probing.Store(false)
			s.redisDown.Store(false)
			s.log.Info("redis reachable again; exact decisions resumed")
			return
		}
	}
}
