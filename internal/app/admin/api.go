// Package admin serves quotaflow's admin REST API under /api/v1: the rules, tiers, users and
// overrides of the rule store, and each user's limits as a checker enforces them. Callers
// authenticate with bearer tokens, each rate-limited per minute in the checkers' shared
// buckets. The API writes to the rule store only; every checker sees a change through its own
// watch of the store, within a fraction of a second.
package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bearer"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// RuleStore is the configuration store the admin API reads and writes (the rule store in NATS KV in
// production). Every write is validated by the store against the whole configuration and
// refused whole; the checkers see the change through their own watch, not through this API.
// Its errors rules.ErrNotFound, rules.ErrExists and rules.ErrNotSeeded are answered 404, 409
// and 503. Every write names its actor, the calling token's name (an override's its Creator),
// which the store records with the change on the events stream.
type RuleStore interface {
	Current(ctx context.Context) (*rules.Set, error)
	Apply(ctx context.Context, doc *rules.Document, actor string, opts rules.ApplyOptions) (rules.Changes, error)
	CreateRule(ctx context.Context, rule rules.DocRule, actor string) error
	PutRule(ctx context.Context, rule rules.DocRule, actor string) (created bool, err error)
	DeleteRule(ctx context.Context, id, actor string) error
	SetUserTier(ctx context.Context, userID, tier, actor string) error
	SetUserZone(ctx context.Context, userID, timezone string, anchorDay int, actor string) error
	SetUserOrg(ctx context.Context, userID, org, actor string) error
	PutOverride(ctx context.Context, o rules.Override) error
	DeleteOverride(ctx context.Context, id, actor string) error
	Overrides(ctx context.Context) ([]rules.Override, error)
	PutExemption(ctx context.Context, e rules.DocExemption, actor string) (created bool, err error)
	DeleteExemption(ctx context.Context, id, actor string) error
	// RecordGrant publishes the audit event of a grant made or voided (grants live with the
	// balances in Redis).
	RecordGrant(ctx context.Context, action, actor string, d events.GrantDetail) error
}

// Admin token roles.
const (
	RoleRead  = "read"
	RoleWrite = "write"
)

// Token is who holds a bearer token of the admin API, and what it may do: RoleRead reads,
// RoleWrite reads and writes.
type Token struct {
	Name string
	Role string
}

// Config configures the admin API. The zero value is usable: an API that refuses every call.
type Config struct {
	// RuleStore is where the configuration lives; nil answers every /api/v1 call with 503.
	RuleStore RuleStore
	// Tokens maps a bearer token to its holder. None: every call is refused with 401, so that
	// the API is never open by default.
	Tokens map[string]Token
	// ReadPerMinute and WritePerMinute rate-limit each token's reads and writes with the
	// checker's own buckets; 0 means 1000 and 100.
	ReadPerMinute, WritePerMinute int
	// Lockout counts the failed authentications of each source address: past its limit, every
	// call from the address is refused (429) until its bucket refills. Give it the check API's
	// (transport.Config.Lockout), so that both APIs spend one failure budget. nil means a
	// Lockout of the engine's store with AuthFailuresPerMinute, believing no proxy.
	Lockout *auth.Lockout
	// AuthFailuresPerMinute is the limit of the Lockout made when Lockout is nil; 0 means
	// auth.DefaultFailuresPerMinute.
	AuthFailuresPerMinute int
	// Backtester runs POST /api/v1/rules:backtest; nil answers it 503.
	Backtester Backtester
	// Audit answers the usage and subject reads of the console (GET /api/v1/usage...); nil
	// answers them 503.
	Audit Audit
	// JetStream feeds GET /api/v1/live from the events stream and the processes' health
	// reports, and tells NATS's health; nil answers the feed 503.
	JetStream jetstream.JetStream
	// Webhooks stores the webhook endpoints (nil answers /api/v1/webhooks 503); WebhookPolicy
	// is where they may point, checked (with DNS) when one is set. Their delivery log is read
	// from Audit, when it has one (Deliveries).
	Webhooks      Webhooks
	WebhookPolicy webhook.URLPolicy
	// MaxLiveFeeds bounds the live feeds this checker serves at once (each holds two
	// consumers, of the events stream and of the health reports); past it GET /api/v1/live
	// answers 503. 0 means 32.
	MaxLiveFeeds int
	// MaxLiveFeedsPerToken bounds the live feeds one token holds at once, so that one read
	// token cannot take them all (0 means 4); MaxLiveFeedDuration ends a feed after that long
	// (0 means an hour: the console's EventSource reconnects, and a forgotten client lets go).
	MaxLiveFeedsPerToken int
	MaxLiveFeedDuration  time.Duration
	// Logger receives the API's logs (every write, with the token's name), with
	// "component"="admin"; nil means slog.Default().
	Logger *slog.Logger
}

// maxAdminBody bounds request bodies: a whole rules document fits many times over.
const maxAdminBody = 1 << 20

// API serves /api/v1. Its methods are safe for concurrent use.
type API struct {
	engine *checker.Engine
	log    *slog.Logger
	store  RuleStore
	tokens map[string]Token // by hex SHA-256 of the token
	read   int64
	write  int64
	lock   *auth.Lockout
	// backtester runs backtests (Config.Backtester); nil when the checker has no audit.
	backtester    Backtester
	backtesting   atomic.Bool         // one backtest at a time
	audit         Audit               // nil: no ClickHouse
	js            jetstream.JetStream // nil: no NATS
	webhooks      Webhooks            // nil: no NATS
	webhookPolicy webhook.URLPolicy
	deliveries    Deliveries    // nil: no ClickHouse
	ledger        Ledger        // nil: no ClickHouse
	feeds         chan struct{} // a place per live feed served at once
	feedsMu       sync.Mutex
	feedsBy       map[string]int // live feeds served now, by token name
	feedsPer      int
	feedFor       time.Duration
}

// New returns the API for cfg. The engine rate-limits the tokens in its store and reports
// users' remaining quotas.
func New(engine *checker.Engine, cfg Config) *API {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	a := &API{engine: engine, log: log.With("component", "admin"), store: cfg.RuleStore, tokens: make(map[string]Token, len(cfg.Tokens)),
		read: int64(cfg.ReadPerMinute), write: int64(cfg.WritePerMinute), backtester: cfg.Backtester,
		audit: cfg.Audit, js: cfg.JetStream, webhooks: cfg.Webhooks, webhookPolicy: cfg.WebhookPolicy}
	if d, ok := cfg.Audit.(Deliveries); ok {
		a.deliveries = d
	}
	if l, ok := cfg.Audit.(Ledger); ok {
		a.ledger = l
	}
	// Tokens are looked up by hash: comparing the secret itself byte by byte would leak its
	// prefix through timing, and the hash is also the rate-limit key, so no secret reaches Redis.
	for tok, who := range cfg.Tokens {
		a.tokens[tokenHash(tok)] = who
	}
	if cfg.MaxLiveFeeds <= 0 {
		cfg.MaxLiveFeeds = 32
	}
	a.feeds = make(chan struct{}, cfg.MaxLiveFeeds)
	a.feedsBy, a.feedsPer, a.feedFor = map[string]int{}, cfg.MaxLiveFeedsPerToken, cfg.MaxLiveFeedDuration
	if a.feedsPer <= 0 {
		a.feedsPer = 4
	}
	if a.feedFor <= 0 {
		a.feedFor = time.Hour
	}
	if a.read <= 0 {
		a.read = 1000
	}
	if a.write <= 0 {
		a.write = 100
	}
	if a.lock = cfg.Lockout; a.lock == nil {
		a.lock = auth.NewLockout(engine, auth.LockoutConfig{FailuresPerMinute: cfg.AuthFailuresPerMinute, Logger: log})
	}
	return a
}

func tokenHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// caller is the authenticated holder of a request's token.
type caller struct {
	Token
	hash string
}

// adminHandler is one endpoint: it gets the authenticated caller and returns the status and
// body to send, or an error that writeAPIError renders.
type adminHandler func(r *http.Request, c caller) (int, any, error)

// Handler serves /api/v1/ (mount it there).
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern, role string, h adminHandler) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { a.serve(w, r, role, true, h) })
	}
	// The console's reads need no rule store: they answer while NATS is down.
	read := func(pattern string, h adminHandler) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { a.serve(w, r, RoleRead, false, h) })
	}
	route("GET /api/v1/rules", RoleRead, a.getRules)
	route("PUT /api/v1/rules", RoleWrite, a.applyRules)
	route("POST /api/v1/rules", RoleWrite, a.createRule)
	route("POST /api/v1/rules:backtest", RoleRead, a.backtest)
	route("GET /api/v1/rules/{rule_id}", RoleRead, a.getRule)
	route("PUT /api/v1/rules/{rule_id}", RoleWrite, a.putRule)
	route("DELETE /api/v1/rules/{rule_id}", RoleWrite, a.deleteRule)
	route("GET /api/v1/users/{user_id}/limits", RoleRead, a.userLimits)
	route("PUT /api/v1/users/{user_id}/tier", RoleWrite, a.setTier)
	route("PUT /api/v1/users/{user_id}/timezone", RoleWrite, a.setZone)
	route("PUT /api/v1/users/{user_id}/org", RoleWrite, a.setOrg)
	route("POST /api/v1/users/{user_id}/override", RoleWrite, a.userOverride)
	route("GET /api/v1/overrides", RoleRead, a.listOverrides)
	route("POST /api/v1/overrides", RoleWrite, a.createOverride)
	route("DELETE /api/v1/overrides/{id}", RoleWrite, a.deleteOverride)
	route("GET /api/v1/exemptions", RoleRead, a.listExemptions)
	route("PUT /api/v1/exemptions/{id}", RoleWrite, a.putExemption)
	route("DELETE /api/v1/exemptions/{id}", RoleWrite, a.deleteExemption)
	route("GET /api/v1/grants", RoleRead, a.listGrants)
	route("POST /api/v1/grants", RoleWrite, a.createGrant)
	route("POST /api/v1/grants/{id}/void", RoleWrite, a.voidGrant)
	route("GET /api/v1/webhooks", RoleRead, a.listWebhooks)
	route("PUT /api/v1/webhooks/{id}", RoleWrite, a.putWebhook)
	route("DELETE /api/v1/webhooks/{id}", RoleWrite, a.deleteWebhook)
	route("GET /api/v1/webhooks/{id}/deliveries", RoleRead, a.webhookDeliveries)
	route("GET /api/v1/billing", RoleRead, a.billing)
	route("GET /api/v1/ledger/balance", RoleRead, a.ledgerBalance)
	read("GET /api/v1/health", a.health)
	read("GET /api/v1/live", a.live)
	read("GET /api/v1/usage", a.usage)
	read("GET /api/v1/usage/top", a.topSubjects)
	read("GET /api/v1/subjects/{subject}/limits", a.subjectLimits)
	read("GET /api/v1/subjects/{subject}/decisions", a.subjectDecisions)
	read("GET /api/v1/subjects/{subject}/billing", a.subjectBilling)
	mux.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, &Error{Status: http.StatusNotFound, Code: "not_found",
			Message: fmt.Sprintf("no admin endpoint %s %s", r.Method, r.URL.Path)})
	})
	return mux
}

// serve authenticates, authorizes and rate-limits a call, then runs h; a call that needs the
// rule store is answered 503 without one.
func (a *API) serve(w http.ResponseWriter, r *http.Request, role string, needStore bool, h adminHandler) {
	if a.store == nil && needStore {
		writeAPIError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "the admin API needs the rule store: start the checker with --nats-url"})
		return
	}
	// Every call from a locked-out address is refused before its token is looked at, so that
	// a guess cannot be told right or wrong.
	src := a.lock.Source(r.RemoteAddr, r.Header.Values)
	if err := a.lock.Check(r.Context(), src); err != nil {
		writeAPIError(w, lockedOut(err))
		return
	}
	c, err := a.authenticate(r)
	if err != nil {
		if lerr := a.lock.Fail(r.Context(), src, err); lerr != nil {
			err = lockedOut(lerr)
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="quotaflow"`)
		writeAPIError(w, err)
		return
	}
	if role == RoleWrite && c.Role != RoleWrite {
		writeAPIError(w, &Error{Status: http.StatusForbidden, Code: "permission_denied",
			Message: fmt.Sprintf("token %q is read-only; %s %s needs a write token", c.Name, r.Method, r.URL.Path)})
		return
	}
	if err := a.limit(r.Context(), c, role); err != nil {
		writeAPIError(w, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxAdminBody)
	status, body, err := h(r, c)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	switch b := body.(type) {
	case csvBody:
		b.writeCSV(w, status)
		return
	case streamBody:
		b(w, r)
		return
	}
	writeJSON(w, status, body)
}

func (a *API) authenticate(r *http.Request) (caller, error) {
	if len(a.tokens) == 0 {
		return caller{}, &Error{Status: http.StatusUnauthorized, Code: "unauthenticated",
			Message: "the admin API has no tokens configured: start the checker with --admin-token or --admin-tokens-file"}
	}
	tok, ok := bearer.Token(r.Header.Get("Authorization"))
	if !ok {
		return caller{}, &Error{Status: http.StatusUnauthorized, Code: "unauthenticated",
			Message: "send an admin token: Authorization: Bearer <token>"}
	}
	h := tokenHash(tok)
	who, ok := a.tokens[h]
	if !ok {
		return caller{}, &Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "unknown admin token"}
	}
	return caller{Token: who, hash: h}, nil
}

// limit charges the call to its token's read or write bucket: a token bucket per minute in
// Redis, shared by every checker, or this process's own while Redis is unreachable.
func (a *API) limit(ctx context.Context, c caller, role string) error {
	perMinute := a.read
	if role == RoleWrite {
		perMinute = a.write
	}
	res, err := a.engine.Take(ctx, checker.Allowance{Namespace: "admin", ID: c.hash[:32], Name: role, PerMinute: perMinute})
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "admin rate limit: " + err.Error()}
	}
	if res.Allowed {
		return nil
	}
	retry := res.RetryAfter
	return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", RetryAfter: retry,
		Message: fmt.Sprintf("token %q exceeded %d %ss per minute; retry after %s", c.Name, perMinute, role, retry.Round(time.Millisecond))}
}

// decodeBody reads a JSON body into dst, refusing unknown fields and trailing data; a field of
// the wrong type or an unknown one is named.
func decodeBody(r *http.Request, dst any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		if _, extra := dec.Token(); extra != io.EOF {
			return badField("body", "want one JSON object, got more after it")
		}
		return nil
	}
	var (
		te *json.UnmarshalTypeError
		se *json.SyntaxError
		me *http.MaxBytesError
	)
	switch {
	case errors.As(err, &me):
		return err
	case errors.As(err, &te) && te.Field != "":
		return badField(te.Field, "want a JSON %s, got %s", te.Type, te.Value)
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
		return badField("body", "not valid JSON: %v", err)
	case errors.Is(err, io.EOF):
		return badField("body", "empty: want a JSON object")
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return badField(name, "unknown field")
	}
	// A nested value's own decoder (rules.Scalar) names no field: report its message.
	return badField("body", "%v", err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
