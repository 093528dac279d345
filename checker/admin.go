package checker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// ConfigStore is the configuration store the admin API reads and writes (rulestore.Store in
// production). Every write is validated by the store against the whole configuration and
// refused whole; the checkers see the change through their own watch, not through this API.
type ConfigStore interface {
	Current(ctx context.Context) (*rules.Set, error)
	Apply(ctx context.Context, doc *rules.Document) error
	CreateRule(ctx context.Context, rule rules.DocRule) error
	PutRule(ctx context.Context, rule rules.DocRule) (created bool, err error)
	DeleteRule(ctx context.Context, id string) error
	SetUserTier(ctx context.Context, userID, tier string) error
	PutOverride(ctx context.Context, o rules.Override) error
	DeleteOverride(ctx context.Context, id, actor string) error
	Overrides(ctx context.Context) ([]rules.Override, error)
}

// Admin token roles.
const (
	RoleRead  = "read"
	RoleWrite = "write"
)

// AdminToken is who holds a bearer token of the admin API, and what it may do: RoleRead
// reads, RoleWrite reads and writes.
type AdminToken struct {
	Name string
	Role string
}

// AdminConfig configures the admin REST API under /api/v1.
type AdminConfig struct {
	// Store is where the configuration lives; nil answers every /api/v1 call with 503.
	Store ConfigStore
	// Tokens maps a bearer token to its holder. None: every call is refused with 401, so that
	// the API is never open by default.
	Tokens map[string]AdminToken
	// ReadPerMinute and WritePerMinute rate-limit each token's reads and writes with the
	// checker's own buckets; 0 means 1000 and 100.
	ReadPerMinute, WritePerMinute int
}

// maxAdminBody bounds request bodies: a whole rules document fits many times over.
const maxAdminBody = 1 << 20

// admin serves /api/v1.
type admin struct {
	s      *Server
	store  ConfigStore
	tokens map[string]AdminToken // by hex SHA-256 of the token
	read   int64
	write  int64
}

func newAdmin(s *Server, cfg AdminConfig) *admin {
	a := &admin{s: s, store: cfg.Store, tokens: make(map[string]AdminToken, len(cfg.Tokens)),
		read: int64(cfg.ReadPerMinute), write: int64(cfg.WritePerMinute)}
	// Tokens are looked up by hash: comparing the secret itself byte by byte would leak its
	// prefix through timing, and the hash is also the rate-limit key, so no secret reaches Redis.
	for tok, who := range cfg.Tokens {
		a.tokens[tokenHash(tok)] = who
	}
	if a.read <= 0 {
		a.read = 1000
	}
	if a.write <= 0 {
		a.write = 100
	}
	return a
}

func tokenHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// caller is the authenticated holder of a request's token.
type caller struct {
	AdminToken
	hash string
}

// adminHandler is one endpoint: it gets the authenticated caller and returns the status and
// body to send, or an error that apiError renders.
type adminHandler func(r *http.Request, c caller) (int, any, error)

func (a *admin) register(mux *http.ServeMux) {
	route := func(pattern, role string, h adminHandler) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { a.serve(w, r, role, h) })
	}
	route("GET /api/v1/rules", RoleRead, a.getRules)
	route("PUT /api/v1/rules", RoleWrite, a.applyRules)
	route("POST /api/v1/rules", RoleWrite, a.createRule)
	route("GET /api/v1/rules/{rule_id}", RoleRead, a.getRule)
	route("PUT /api/v1/rules/{rule_id}", RoleWrite, a.putRule)
	route("DELETE /api/v1/rules/{rule_id}", RoleWrite, a.deleteRule)
	route("GET /api/v1/users/{user_id}/limits", RoleRead, a.userLimits)
	route("PUT /api/v1/users/{user_id}/tier", RoleWrite, a.setTier)
	route("POST /api/v1/users/{user_id}/override", RoleWrite, a.userOverride)
	route("GET /api/v1/overrides", RoleRead, a.listOverrides)
	route("POST /api/v1/overrides", RoleWrite, a.createOverride)
	route("DELETE /api/v1/overrides/{id}", RoleWrite, a.deleteOverride)
	mux.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, &apiErr{status: http.StatusNotFound, code: "not_found",
			msg: fmt.Sprintf("no admin endpoint %s %s", r.Method, r.URL.Path)})
	})
}

// serve authenticates, authorizes and rate-limits a call, then runs h.
func (a *admin) serve(w http.ResponseWriter, r *http.Request, role string, h adminHandler) {
	if a.store == nil {
		writeAPIError(w, &apiErr{status: http.StatusServiceUnavailable, code: "unavailable",
			msg: "the admin API needs the rule store: start the checker with --nats-url"})
		return
	}
	c, err := a.authenticate(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="quotaflow"`)
		writeAPIError(w, err)
		return
	}
	if role == RoleWrite && c.Role != RoleWrite {
		writeAPIError(w, &apiErr{status: http.StatusForbidden, code: "permission_denied",
			msg: fmt.Sprintf("token %q is read-only; %s %s needs a write token", c.Name, r.Method, r.URL.Path)})
		return
	}
	if err := a.limit(r.Context(), c, role); err != nil {
		if e, ok := err.(*apiErr); ok && e.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(e.retryAfter.Milliseconds()), 10))
		}
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
	writeJSON(w, status, body)
}

func (a *admin) authenticate(r *http.Request) (caller, error) {
	if len(a.tokens) == 0 {
		return caller{}, &apiErr{status: http.StatusUnauthorized, code: "unauthenticated",
			msg: "the admin API has no tokens configured: start the checker with --admin-token or --admin-tokens-file"}
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return caller{}, &apiErr{status: http.StatusUnauthorized, code: "unauthenticated",
			msg: "send an admin token: Authorization: Bearer <token>"}
	}
	h := tokenHash(strings.TrimSpace(tok))
	who, ok := a.tokens[h]
	if !ok {
		return caller{}, &apiErr{status: http.StatusUnauthorized, code: "unauthenticated", msg: "unknown admin token"}
	}
	return caller{AdminToken: who, hash: h}, nil
}

// limit charges the call to its token's read or write bucket: a token bucket per minute in
// Redis, shared by every checker, or this process's own while Redis is unreachable.
func (a *admin) limit(ctx context.Context, c caller, role string) error {
	perMinute := a.read
	if role == RoleWrite {
		perMinute = a.write
	}
	// The "admin" namespace is no rule dimension, so no subject's bucket can share the key.
	req := bucket.Request{Cost: 1, Limits: []bucket.Limit{{
		Key:       "rl:{admin:" + c.hash[:32] + "}:tb:1m:" + role,
		Algorithm: bucket.TokenBucket, Limit: perMinute, Window: time.Minute, Burst: perMinute,
	}}}
	var res bucket.Result
	done := false
	if !a.s.redisDown.Load() {
		rctx, cancel := context.WithTimeout(ctx, a.s.timeout)
		results, err := a.s.store.Check(rctx, []bucket.Request{req})
		cancel()
		switch {
		case err == nil:
			res, done = results[0], true
		case ctx.Err() != nil:
			return ctx.Err()
		case redisUnavailable(err):
			a.s.markRedisDown(err)
		default:
			return &apiErr{status: http.StatusServiceUnavailable, code: "unavailable", msg: "admin rate limit: " + err.Error()}
		}
	}
	if !done {
		res = a.s.local.Check(time.Now(), req)
	}
	if res.Allowed {
		return nil
	}
	retry := res.Limits[0].RetryAfter
	return &apiErr{status: http.StatusTooManyRequests, code: "rate_limited", retryAfter: retry,
		msg: fmt.Sprintf("token %q exceeded %d %ss per minute; retry after %s", c.Name, perMinute, role, retry.Round(time.Millisecond))}
}

// apiErr is an error with its HTTP rendering.
type apiErr struct {
	status     int
	code       string
	field      string
	msg        string
	problems   []string
	retryAfter time.Duration
}

func (e *apiErr) Error() string { return e.msg }

func badField(field, format string, args ...any) *apiErr {
	return &apiErr{status: http.StatusBadRequest, code: "invalid_argument", field: field,
		msg: field + ": " + fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiErr {
	return &apiErr{status: http.StatusNotFound, code: "not_found", msg: fmt.Sprintf(format, args...)}
}

// apiErrorBody is the JSON of every admin API error.
type apiErrorBody struct {
	Error    string   `json:"error"`
	Field    string   `json:"field,omitempty"`
	Message  string   `json:"message"`
	Problems []string `json:"problems,omitempty"`
}

// writeAPIError renders err: the API's own errors as they say, the store's by kind, and
// anything else (the store unreachable) as 503.
func writeAPIError(w http.ResponseWriter, err error) {
	var (
		ae *apiErr
		fe *rules.FieldError
		ve *rules.ValidationError
		me *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &fe):
		ae = badField(fe.Field, "%s", fe.Problem)
	case errors.As(err, &ve):
		ae = &apiErr{status: http.StatusBadRequest, code: "invalid_argument", problems: ve.Problems,
			msg: "refused, nothing was changed: " + err.Error()}
	case errors.As(err, &me):
		ae = &apiErr{status: http.StatusRequestEntityTooLarge, code: "invalid_argument", field: "body",
			msg: fmt.Sprintf("body: larger than %d bytes", me.Limit)}
	case errors.Is(err, rules.ErrNotFound):
		ae = notFound("%v", err)
	case errors.Is(err, rules.ErrExists):
		ae = &apiErr{status: http.StatusConflict, code: "already_exists", msg: err.Error()}
	case errors.Is(err, rules.ErrNotSeeded):
		ae = &apiErr{status: http.StatusServiceUnavailable, code: "unavailable", msg: err.Error()}
	case errors.Is(err, context.Canceled):
		return // the caller went away
	default:
		ae = &apiErr{status: http.StatusServiceUnavailable, code: "unavailable", msg: "rule store: " + err.Error()}
	}
	writeJSON(w, ae.status, apiErrorBody{Error: ae.code, Field: ae.field, Message: ae.msg, Problems: ae.problems})
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
