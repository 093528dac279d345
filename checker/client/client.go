// Package client checks rate limits against a quotaflow checker from a Go service: deadlines,
// retries that never charge twice, a fail mode of its own when the checker cannot be reached,
// a local deny cache, and concurrent checks coalesced into one CheckRateLimits call.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/internal/retry"
	"github.com/quotaflow/quotaflow/internal/urlpath"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// Protocol is the wire protocol a Client speaks to the checker.
type Protocol int

const (
	// Connect is the Connect protocol (binary protobuf over HTTP/1.1 or h2c).
	Connect Protocol = iota
	// GRPC is gRPC over h2c, which the checker serves with grpc-go.
	GRPC
	// GRPCWeb is gRPC-Web over HTTP/1.1 or h2c, as browsers and gateways without HTTP/2
	// trailers speak it.
	GRPCWeb
)

// FailMode says what a Client decides when the checker cannot be reached.
type FailMode int

const (
	// FailOpen allows every check: an outage of the checker never stops the service.
	FailOpen FailMode = iota
	// FailClosed denies every check.
	FailClosed
	// FailLocal decides with a token bucket per subject and endpoint kept in this process
	// (Config.LocalRate, Config.LocalBurst).
	FailLocal
)

// String returns the fail mode's name.
func (m FailMode) String() string {
	switch m {
	case FailClosed:
		return "closed"
	case FailLocal:
		return "local"
	}
	return "open"
}

// Config configures a Client. The zero value is usable: Connect, a 250 ms deadline per
// attempt, 2 retries, fail open, the deny cache on, coalescing within 1 ms up to 64 checks.
type Config struct {
	// Protocol is Connect (the default), GRPC or GRPCWeb.
	Protocol Protocol
	// HTTPClient carries the calls; nil means one that speaks HTTP/1.1 and h2c. A GRPC client
	// needs HTTP/2: without TLS, an http.Client with only unencrypted HTTP/2 enabled.
	HTTPClient *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>" (a caller of --callers-file).
	Token string
	// Timeout bounds each attempt; 0 means 250 ms. The caller's context bounds them all.
	Timeout time.Duration
	// Retries is how many times a call that failed transiently (Unavailable, a deadline, a
	// broken connection) is sent again with the same idempotency keys; 0 means 2, negative none.
	Retries int
	// Backoff is the wait before the first retry, doubled before each next one; 0 means 10 ms.
	Backoff time.Duration
	// FailMode decides when the checker cannot be reached; the zero value is FailOpen.
	FailMode FailMode
	// LocalRate and LocalBurst size FailLocal's buckets: checks per second and at most how many
	// at once; 0 means 10 and 20.
	LocalRate  float64
	LocalBurst int
	// ProbeInterval is how long after a failed call checks go straight to the fail mode, so that
	// an outage does not cost every check its deadlines; 0 means 1 s.
	ProbeInterval time.Duration
	// NoDenyCache turns the deny cache off: every check asks the checker.
	NoDenyCache bool
	// BatchWait is how long a check that arrives while a batch is in flight waits at most for
	// others to travel with it in one CheckRateLimits call (it leaves sooner when the batch in
	// flight comes back; with none in flight it leaves at once); 0 means 1 ms, negative turns
	// coalescing off (each check is one CheckRateLimit).
	BatchWait time.Duration
	// BatchMax sends a batch as soon as it holds this many checks; 0 means 64.
	BatchMax int
	// Logger receives the client's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Dimension is the kind of a subject.
type Dimension int32

const (
	// User is a user id.
	User = Dimension(quotaflowv1.Dimension_DIMENSION_USER)
	// IP is a client IP address.
	IP = Dimension(quotaflowv1.Dimension_DIMENSION_IP)
	// APIKey is an API key.
	APIKey = Dimension(quotaflowv1.Dimension_DIMENSION_API_KEY)
)

// Subject is one party a check counts against.
type Subject struct {
	Dimension Dimension
	ID        string
	// CustomDimension names a custom dimension (Custom); Dimension is then unset.
	CustomDimension string
}

// Custom is the subject of custom dimension name ("tenant") with value ("acme"): rules of
// dimension: tenant count it. A request's custom subjects form one descriptor, in order.
func Custom(name, value string) Subject { return Subject{CustomDimension: name, ID: value} }

// Request is one check.
type Request struct {
	// Subjects are the parties of the incoming call (at most one per dimension); every
	// matching limit of each must allow.
	Subjects []Subject
	// Endpoint is the path called.
	Endpoint string
	// Cost is what the call consumes; 0 means 1.
	Cost int64
	// Tier, when set, decides under that tier (needs the assert-tier permission).
	Tier string
	// IdempotencyKey makes a retried check count once; empty means the Client makes one for
	// this check, so that its own retries never charge twice.
	IdempotencyKey string
	// Entitlement names an entitlement whose balance the check burns by Cost, besides those
	// the endpoint burns; the balance is reported in Policies and, when it decides, as the
	// Decision's Remaining.
	Entitlement string
}

// Source says who made a Decision.
type Source int

const (
	// SourceChecker: the checker decided.
	SourceChecker Source = iota
	// SourceDenyCache: the deny cache repeated a denial of the checker that still stands.
	SourceDenyCache
	// SourceFailMode: the checker could not be reached and Config.FailMode decided.
	SourceFailMode
)

// String returns the source's name.
func (s Source) String() string {
	switch s {
	case SourceDenyCache:
		return "deny-cache"
	case SourceFailMode:
		return "fail-mode"
	}
	return "checker"
}

// Policy is one evaluated limit, for RateLimit-Policy headers.
type Policy struct {
	RuleID string
	Limit  int64
	Window time.Duration
	// Burst is what a bucket algorithm admits at once, when it differs from Limit.
	Burst int64
}

// Decision is the answer to a check.
type Decision struct {
	Allowed bool
	// RuleID, Limit, Remaining and ResetAt are the deciding limit's (see the check API).
	RuleID    string
	Limit     int64
	Remaining int64
	ResetAt   time.Time
	// RetryAfter is how long to wait when denied; 0 when allowed.
	RetryAfter time.Duration
	// Delay is, when allowed, how long to wait before going on: a rule that delays instead
	// of denying (on_limit: delay) queued the request, and its slot comes that long after the
	// decision. 0 for most requests. The middleware and interceptors wait it before calling
	// the handler; a caller of Check waits it itself (Decision.Wait).
	Delay time.Duration
	// Policies are the limits the checker evaluated.
	Policies []Policy
	// Replayed: the checker had seen the idempotency key and charged nothing.
	Replayed bool
	// Degraded: a fail mode decided. With Source SourceFailMode the client's, because the
	// checker could not be reached (Err says why); with SourceChecker the checker's own, because
	// Redis could not be reached behind it.
	Degraded bool
	Source   Source
	Err      error
	// LeaseID is set when an allowed check matched concurrency rules: it holds a place in
	// flight in each until ReleaseLease, or until LeaseExpiresAt unless RenewLease extends it.
	// The middleware and interceptors release it when the handler returns.
	LeaseID        string
	LeaseExpiresAt time.Time
	// endsEarly reports that the deciding limit's denial may end at any time before its retry
	// (a concurrency place released, a balance topped up by a grant): it is not cached.
	endsEarly bool
}

// Client checks rate limits. Its methods are safe for concurrent use.
type Client struct {
	cfg   Config
	rpc   quotaflowv1connect.RateLimiterClient
	log   *slog.Logger
	deny  *denyCache
	local *localBuckets
	batch *batcher

	mu        sync.Mutex
	up        bool // the checker answered the last call
	downUntil time.Time
}

// New returns a Client of the checker at baseURL ("http://checker:8080").
func New(baseURL string, cfg Config) *Client {
	if cfg.Timeout == 0 {
		cfg.Timeout = 250 * time.Millisecond
	}
	if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 10 * time.Millisecond
	}
	if cfg.LocalRate == 0 {
		cfg.LocalRate = 10
	}
	if cfg.LocalBurst == 0 {
		cfg.LocalBurst = 20
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.BatchWait == 0 {
		cfg.BatchWait = time.Millisecond
	}
	if cfg.BatchMax == 0 {
		cfg.BatchMax = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rpc := NewRPC(baseURL, RPCConfig{Protocol: cfg.Protocol, HTTPClient: cfg.HTTPClient, Token: cfg.Token})
	c := &Client{up: true, cfg: cfg, rpc: rpc, log: cfg.Logger.With("component", "quotaflow-client"),
		local: newLocalBuckets(cfg.LocalRate, cfg.LocalBurst)}
	if !cfg.NoDenyCache {
		c.deny = newDenyCache()
	}
	if cfg.BatchWait > 0 {
		c.batch = &batcher{c: c}
	}
	return c
}

// Close stops sending: checks waiting to be coalesced are sent at once.
func (c *Client) Close() {
	if c.batch != nil {
		c.batch.flushNow()
	}
}

// Check asks whether req may go ahead. A denial is a Decision with Allowed false, never an
// error; when the checker cannot be reached the fail mode decides (Decision.Degraded). The error
// is for a request the checker refused (an invalid field, a missing permission; an endpoint
// that is no path, InvalidArgument, is refused before it is sent) and for ctx ending first.
func (c *Client) Check(ctx context.Context, req Request) (Decision, error) {
	// The deny cache and the local buckets key on the endpoint's normal form, as the checker
	// matches it: another spelling of a denied path must find the denial. A path the checker
	// would refuse is refused here, before it can key anything.
	ep, err := urlpath.Normalize(req.Endpoint)
	if err != nil {
		return Decision{}, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("quotaflow check: endpoint: %q %w", req.Endpoint, err))
	}
	req.Endpoint = ep
	now := time.Now()
	key := subjectKey(req)
	if c.deny != nil {
		if d, ok := c.deny.get(key, req.Cost, now); ok {
			return d, nil
		}
	}
	if c.isDown(now) {
		return c.failMode(key, errors.New("quotaflow client: checker unreachable, probing again later")), nil
	}
	msg := req.proto()
	var resp *quotaflowv1.CheckRateLimitResponse
	if c.batch != nil {
		resp, err = c.batch.check(ctx, msg)
	} else {
		resp, err = c.checkOne(ctx, msg)
	}
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("quotaflow check: %w", ctx.Err())
		}
		if transient(err) {
			if c.markDown() {
				// Once per outage, not once per check of a failed batch.
				c.log.Warn("checker unreachable, fail mode decides", "fail_mode", c.cfg.FailMode.String(), "err", err)
			}
			return c.failMode(key, err), nil
		}
		return Decision{}, fmt.Errorf("quotaflow check: %w", err)
	}
	c.markUp()
	d := decision(resp)
	// A fail mode's denial says nothing of the buckets: only a real one is cached.
	if c.deny != nil && !d.Allowed && d.RetryAfter > 0 && !d.Degraded && !d.endsEarly {
		c.deny.put(key, req.Cost, d, now.Add(d.RetryAfter))
	}
	return d, nil
}

// checkOne sends one CheckRateLimit, retried while it fails transiently.
func (c *Client) checkOne(ctx context.Context, msg *quotaflowv1.CheckRateLimitRequest) (*quotaflowv1.CheckRateLimitResponse, error) {
	var resp *connect.Response[quotaflowv1.CheckRateLimitResponse]
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.rpc.CheckRateLimit(ctx, connect.NewRequest(msg))
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// retry calls f, each attempt bounded by Config.Timeout, until it succeeds, fails for good, or
// Config.Retries retries failed transiently. The requests f sends carry idempotency keys, so a
// retry of a check the checker did decide is replayed, not charged again.
func (c *Client) retry(ctx context.Context, f func(context.Context) error) error {
	backoff := retry.Backoff{Min: c.cfg.Backoff}
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		err := f(actx)
		cancel()
		if err == nil || !transient(err) || ctx.Err() != nil || attempt >= c.cfg.Retries {
			return err
		}
		if !retry.Sleep(ctx, backoff.Next()) {
			return err
		}
	}
}

// transient tells whether a call that failed with err may succeed if sent again. Canceled is
// among them: connect-go reports a write on a connection the checker closed ("broken pipe") as
// Canceled; a caller that did cancel is told apart by its own context, which every caller of
// transient looks at first.
func transient(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeAborted, connect.CodeUnknown, connect.CodeCanceled:
		return true
	}
	return false
}

func (c *Client) isDown(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return now.Before(c.downUntil)
}

// markDown sends checks to the fail mode for Config.ProbeInterval; it reports whether the
// checker was taken for reachable until now.
func (c *Client) markDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.up
	c.up = false
	c.downUntil = time.Now().Add(c.cfg.ProbeInterval)
	return was
}

func (c *Client) markUp() {
	c.mu.Lock()
	if !c.up {
		c.log.Info("checker reachable")
	}
	c.up = true
	c.downUntil = time.Time{}
	c.mu.Unlock()
}

// failMode is the Decision of Config.FailMode for a check of key that could not reach the
// checker because of err.
func (c *Client) failMode(key string, err error) Decision {
	d := Decision{Allowed: true, Degraded: true, Source: SourceFailMode, Err: err}
	switch c.cfg.FailMode {
	case FailClosed:
		d.Allowed, d.RetryAfter = false, c.cfg.ProbeInterval
	case FailLocal:
		d.Allowed, d.RetryAfter = c.local.take(key, time.Now())
		d.Limit = int64(c.cfg.LocalBurst)
	}
	return d
}

func (r Request) proto() *quotaflowv1.CheckRateLimitRequest {
	m := &quotaflowv1.CheckRateLimitRequest{Endpoint: r.Endpoint, Cost: r.Cost, Tier: r.Tier,
		IdempotencyKey: r.IdempotencyKey, Timestamp: time.Now().UnixMilli(), Entitlement: r.Entitlement}
	if m.IdempotencyKey == "" {
		m.IdempotencyKey = newKey()
	}
	for i, s := range r.Subjects {
		if i == 0 && s.CustomDimension == "" {
			m.Identifier, m.Dimension = s.ID, quotaflowv1.Dimension(s.Dimension)
			continue
		}
		m.Subjects = append(m.Subjects, &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension(s.Dimension), Identifier: s.ID, CustomDimension: s.CustomDimension})
	}
	return m
}

// newKey returns a random idempotency key: 128 bits, so that two checks never share one.
func newKey() string {
	var b [16]byte
	rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "qfc-" + hex.EncodeToString(b[:])
}

// Wait waits d.Delay, the wait an allowed request was given before it may go on, or until ctx
// ends, whose error it then returns: the request's slot is charged all the same.
func (d Decision) Wait(ctx context.Context) error {
	if d.Delay <= 0 {
		return nil
	}
	t := time.NewTimer(d.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func decision(r *quotaflowv1.CheckRateLimitResponse) Decision {
	d := Decision{Allowed: r.Allowed, RuleID: r.RuleId, Limit: r.Limit, Remaining: r.Remaining,
		RetryAfter: time.Duration(r.RetryAfterMs) * time.Millisecond, Replayed: r.Replayed, Degraded: r.Degraded, Source: SourceChecker,
		Delay: time.Duration(r.DelayUs) * time.Microsecond}
	if r.ResetAt > 0 {
		d.ResetAt = time.Unix(r.ResetAt, 0)
	}
	if r.LeaseId != "" {
		d.LeaseID, d.LeaseExpiresAt = r.LeaseId, time.UnixMilli(r.LeaseExpiresAtMs)
	}
	for _, l := range r.Limits {
		if l.RuleId == r.RuleId && (l.Algorithm == "concurrency" || l.Algorithm == "balance") {
			d.endsEarly = true
		}
		if l.Shadow {
			continue // never enforced, so no policy a caller must respect
		}
		d.Policies = append(d.Policies, Policy{RuleID: l.RuleId, Limit: l.Limit, Window: time.Duration(l.WindowMs) * time.Millisecond, Burst: l.Burst})
	}
	return d
}
