package transport

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/outcomepb"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
	"golang.org/x/net/http/httpguts"
)

// forwardAuth serves gateways (nginx auth_request, Caddy forward_auth, Traefik ForwardAuth,
// HAProxy, Envoy ext_authz over HTTP): the subjects and endpoint come from headers, the answer
// is 200 or 429 with the X-RateLimit-*, Retry-After and IETF RateLimit fields and the JSON body
// docs/api.md ("Forward-auth for gateways") describes. ?deny_status=401|403 answers a denial with that
// status instead, for nginx, whose auth_request turns any other status (429 included) into a
// 500; the gateway then rewrites it to 429 (deploy/nginx).
//
// A request that a rule with on_limit: delay queued is allowed with its wait in
// X-Quotaflow-Delay-Ms, for a gateway that can hold it that long (HAProxy's Lua action does);
// ?wait=true makes the endpoint hold its own answer until the request's slot instead (while
// fewer than MaxWaiting are held; past it the wait is told, as without it), so that
// any gateway that waits for its check (nginx auth_request, Caddy forward_auth, Traefik,
// Envoy ext_authz over HTTP, within their timeouts) passes the request on at its slot.
func (s *Server) serveForwardAuth(w http.ResponseWriter, r *http.Request) {
	qs := r.URL.Query() // parsed once: deny_status, wait and the check's own parameters
	denyStatus, err := denyStatus(qs)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	wait, err := waitParam(qs)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	q, err := s.fa.query(r, qs)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if err := s.authorize(r.Context(), auth.Check, "GET /ratelimit/check"); err != nil {
		writeAuthError(w, err)
		return
	}
	if q.Tier != "" {
		if err := s.authorize(r.Context(), auth.AssertTier, s.fa.tierField(r)); err != nil {
			writeAuthError(w, err)
			return
		}
	}
	out, err := s.engine.Check(r.Context(), q)
	if err != nil {
		status, code := httpStatus(err)
		writeJSONError(w, status, code, err.Error())
		return
	}
	h := w.Header()
	body := forwardAuthBody{Allowed: out.Allowed, Tier: out.Tier, Degraded: out.Degraded, DecisionID: out.ID}
	w.Header().Set("X-Quotaflow-Decision-Id", out.ID)
	limitHeaders(h, &body, out)
	if out.Degraded {
		h.Set("X-RateLimit-Degraded", "true")
	}
	if out.Delay > 0 {
		held, gone := s.fa.hold(r, out, wait)
		if gone {
			return // the gateway left: its request was charged at its slot all the same
		}
		if !held {
			body.DelayMs = ratelimitheader.CeilMillis(out.Delay)
			h.Set("X-Quotaflow-Delay-Ms", strconv.FormatInt(body.DelayMs, 10))
		}
	}
	status := http.StatusOK
	contentType := "application/json"
	if !out.Allowed {
		status = denyStatus
		body.Error = "rate_limit_exceeded"
		body.Message = fmt.Sprintf("Too many requests. Please retry after %d seconds.", *body.RetryAfter)
		if acceptsProblem(r) {
			// The draft's quota-exceeded problem type; the members of the plain answer stay,
			// so that a client reading either finds what it knows.
			contentType = "application/problem+json"
			body.Type, body.Title, body.Status = quotaExceededType, quotaExceededTitle, status
			body.ViolatedPolicies = violated(out)
		}
	}
	h.Set("Content-Type", contentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// limitHeaders sets the headers and body members of out's deciding limit: its numbers, the
// IETF RateLimit and RateLimit-Policy fields and, for a denial, Retry-After.
func limitHeaders(h http.Header, body *forwardAuthBody, out *checker.Outcome) {
	l := out.DecidingLimit()
	if l == nil {
		return
	}
	d := outcomepb.Status(l)
	body.RuleID, body.Limit, body.Remaining, body.ResetAt, body.State = d.RuleId, d.Burst, d.Remaining, d.ResetAt, out.State().String()
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Burst, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetAt, 10))
	h.Set("X-RateLimit-State", body.State)
	reset := ratelimitheader.CeilMillis(l.Result.ResetAt.Sub(out.Now))
	h.Set("RateLimit", ratelimitheader.Limit(d.RuleId, d.Remaining, ratelimitheader.CeilSeconds(max(0, reset))))
	h.Set("RateLimit-Policy", policies(out))
	if !out.Allowed {
		secs := ratelimitheader.CeilSeconds(d.RetryAfterMs)
		body.RetryAfter = &secs
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
}

// The problem type of draft-ietf-httpapi-ratelimit-headers-11, section "Problem Types".
const (
	quotaExceededType  = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	quotaExceededTitle = "Request cannot be satisfied as assigned quota has been exceeded"
)

// denyStatus is the status of a denial: 429, or the 401 or 403 that ?deny_status= asks for.
// Only those: a gateway maps a denial it can tell from its other answers, and nginx accepts no
// other.
func denyStatus(qs url.Values) (int, error) {
	v := qs.Get("deny_status")
	switch v {
	case "", "429":
		return http.StatusTooManyRequests, nil
	case "401":
		return http.StatusUnauthorized, nil
	case "403":
		return http.StatusForbidden, nil
	}
	return 0, field.Errorf("deny_status", "want 401, 403 or 429, got %q", v)
}

// waitParam reads ?wait=: whether to hold an allowed answer until the request's slot.
func waitParam(qs url.Values) (bool, error) {
	switch v := qs.Get("wait"); v {
	case "", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	default:
		return false, field.Errorf("wait", "want true or false, got %q", v)
	}
}

// holdUntil waits out's delay, until the request's slot, and reports whether the request is
// still there to be answered. The delay runs from now, as a client's does from its answer: the
// decision's own time is Redis's clock, which this machine's need not agree with.
// hold holds a delayed request until its slot when it asked to wait and a place is free
// (MaxWaiting); gone is set when the gateway left meanwhile. A request not held is told its
// wait instead.
func (fa *forwardAuth) hold(r *http.Request, out *checker.Outcome, wait bool) (held, gone bool) {
	if !wait {
		return false, false
	}
	select {
	case fa.waiting <- struct{}{}:
	default:
		return false, false // every place taken, or none (a nil channel)
	}
	defer func() { <-fa.waiting }()
	return true, !holdUntil(r, out)
}

func holdUntil(r *http.Request, out *checker.Outcome) bool {
	t := time.NewTimer(out.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// acceptsProblem reports whether the client asked for application/problem+json.
func acceptsProblem(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, item := range strings.Split(v, ",") {
			mt, _, _ := strings.Cut(item, ";")
			if strings.EqualFold(strings.TrimSpace(mt), "application/problem+json") {
				return true
			}
		}
	}
	return false
}

// violated lists the enforced rules that denied, each once.
func violated(o *checker.Outcome) []string {
	var ids []string
	for i := range o.Limits {
		l := &o.Limits[i]
		if l.Rule.Shadow || l.Result.Allowed || slices.Contains(ids, l.Rule.ID) {
			continue
		}
		ids = append(ids, l.Rule.ID)
	}
	return ids
}

// forwardAuthBody is the forward-auth answer docs/api.md ("Forward-auth for gateways") describes, with the error fields on a denial.
type forwardAuthBody struct {
	Error      string `json:"error,omitempty"`
	Message    string `json:"message,omitempty"`
	Allowed    bool   `json:"allowed"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	ResetAt    int64  `json:"reset_at"`
	RetryAfter *int64 `json:"retry_after"`
	RuleID     string `json:"rule_id,omitempty"`
	State      string `json:"state,omitempty"`
	Tier       string `json:"tier,omitempty"`
	Degraded   bool   `json:"degraded,omitempty"`
	DecisionID string `json:"decision_id,omitempty"`
	// DelayMs is, for an allowed request a rule with on_limit: delay queued, how long it must
	// wait before going on (X-Quotaflow-Delay-Ms), 0 when it already waited (?wait=true).
	DelayMs int64 `json:"delay_ms,omitempty"`

	// The quota-exceeded problem's members, on a denial to a client that accepts
	// application/problem+json.
	Type             string   `json:"type,omitempty"`
	Title            string   `json:"title,omitempty"`
	Status           int      `json:"status,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// ForwardAuthConfig configures GET /ratelimit/check. The zero value reads the subjects from
// X-User-Id and X-Api-Key, the endpoint from X-Forwarded-Uri (then X-Original-URI, then
// ?endpoint=), takes the connection's address as the client IP, and reads no idempotency key.
type ForwardAuthConfig struct {
	// TrustedProxies are the networks of the proxies in front of the checker. Only from a peer
	// in one of them are X-Forwarded-For (walked from the right, past the trusted proxies),
	// X-Real-Ip and X-Client-Ip believed for the client IP; otherwise the client IP is the
	// connection's address. A client can write any of these headers: a proxy that is not listed
	// cannot vouch for them.
	TrustedProxies []netip.Prefix
	// UserHeader, APIKeyHeader and EndpointHeader name the headers of the user, API key and
	// endpoint; empty means X-User-Id, X-Api-Key and X-Forwarded-Uri.
	UserHeader, APIKeyHeader, EndpointHeader string
	// IdempotencyHeader names the header whose value is the check's idempotency key; empty
	// means none. A key replays an allowed request for 5 minutes, so only a header
	// that the gateway sets (and strips from clients) may carry it.
	IdempotencyHeader string
	// DimensionHeaders name the headers of custom dimensions: a header present is an entry
	// of the check's descriptor (dimension name = header value), in this order. Only a
	// gateway should set them (and strip them from clients), as the user header.
	DimensionHeaders []DimensionHeader
	// MaxWaiting bounds the requests ?wait=true holds at once (each a goroutine and its
	// buffers, ~48 KB): past it a delayed request is answered at once with its wait in
	// X-Quotaflow-Delay-Ms, charged at its slot all the same, so that no number of them can
	// exhaust the process. 0 means DefaultMaxWaiting; negative holds none.
	MaxWaiting int
}

// DefaultMaxWaiting is ForwardAuthConfig.MaxWaiting's default.
const DefaultMaxWaiting = 1024

// DimensionHeader is a custom dimension forward-auth reads from a gateway's header.
type DimensionHeader struct {
	Dimension string // as rules name it (dimension: tenant)
	Header    string
}

// forwardAuth is the resolved ForwardAuthConfig.
type forwardAuth struct {
	ForwardAuthConfig
	endpointFallback bool          // EndpointHeader was defaulted: X-Original-URI and ?endpoint= are read too
	waiting          chan struct{} // a place per request ?wait=true holds (MaxWaiting); nil: none
}

func newForwardAuth(cfg ForwardAuthConfig) forwardAuth {
	fa := forwardAuth{ForwardAuthConfig: cfg}
	switch {
	case cfg.MaxWaiting == 0:
		fa.waiting = make(chan struct{}, DefaultMaxWaiting)
	case cfg.MaxWaiting > 0:
		fa.waiting = make(chan struct{}, cfg.MaxWaiting)
	}
	if fa.UserHeader == "" {
		fa.UserHeader = "X-User-Id"
	}
	if fa.APIKeyHeader == "" {
		fa.APIKeyHeader = "X-Api-Key"
	}
	if fa.EndpointHeader == "" {
		fa.EndpointHeader, fa.endpointFallback = "X-Forwarded-Uri", true
	}
	return fa
}

// clientIP is the request's client address: the connection's, or, from a trusted proxy, the
// address the proxies forwarded (auth.ClientAddr).
func (fa *forwardAuth) clientIP(r *http.Request) string {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr // not an IP connection (a test's pipe): its name is its address
	}
	return auth.ClientAddr(peer.Addr(), fa.TrustedProxies, r.Header.Values).String()
}

// tierField names where the request asserted its tier.
func (fa *forwardAuth) tierField(r *http.Request) string {
	if r.Header.Get("X-RateLimit-Tier") != "" {
		return "X-RateLimit-Tier"
	}
	return "tier"
}

// query reads a check from gateway headers.
func (fa *forwardAuth) query(r *http.Request, qs url.Values) (*checker.Query, error) {
	h := r.Header
	q := &checker.Query{Subjects: make([]checker.Subject, 0, 3)}
	for _, s := range []struct {
		header string
		dim    rules.Dimension
		value  string
	}{
		{fa.UserHeader, rules.DimensionUser, h.Get(fa.UserHeader)},
		{"client IP", rules.DimensionIP, fa.clientIP(r)},
		{fa.APIKeyHeader, rules.DimensionAPIKey, h.Get(fa.APIKeyHeader)},
	} {
		if s.value == "" {
			continue
		}
		if err := field.Text(s.value, checker.MaxIdentifierLen); err != nil {
			return nil, field.Wrap(s.header, err)
		}
		q.Subjects = append(q.Subjects, checker.Subject{Dimension: s.dim, ID: s.value})
	}
	var custom []rules.Entry
	for _, d := range fa.DimensionHeaders {
		v := h.Get(d.Header)
		if v == "" {
			continue
		}
		if err := field.Text(v, checker.MaxIdentifierLen); err != nil {
			return nil, field.Wrap(d.Header, err)
		}
		custom = append(custom, rules.Entry{Key: d.Dimension, Value: v})
	}
	if custom != nil {
		q.Subjects = append(q.Subjects, checker.DescriptorSubject(custom))
	}
	name, ep := fa.EndpointHeader, h.Get(fa.EndpointHeader)
	if ep == "" && fa.endpointFallback {
		name, ep = "X-Original-URI", h.Get("X-Original-URI")
		if ep == "" {
			name, ep = "endpoint", qs.Get("endpoint")
		}
	}
	var err error
	if q.Endpoint, err = field.Endpoint(ep, checker.MaxEndpointLen); err != nil {
		return nil, field.Wrap(name, err)
	}
	cost := h.Get("X-RateLimit-Cost")
	if cost == "" {
		cost = qs.Get("cost")
	}
	if cost != "" {
		n, err := strconv.ParseInt(cost, 10, 64)
		if err != nil {
			return nil, field.Errorf("cost", "want a whole number, got %q", cost)
		}
		q.Cost = n
	}
	if q.Cost, err = field.Cost(q.Cost, checker.MaxCost); err != nil {
		return nil, field.Wrap("cost", err)
	}
	if fa.IdempotencyHeader != "" {
		if q.IdempotencyKey = h.Get(fa.IdempotencyHeader); q.IdempotencyKey != "" {
			if err := field.Text(q.IdempotencyKey, checker.MaxIdempotentLen); err != nil {
				return nil, field.Wrap(fa.IdempotencyHeader, err)
			}
		}
	}
	q.Tier = h.Get("X-RateLimit-Tier")
	if q.Tier == "" {
		q.Tier = qs.Get("tier")
	}
	return q, nil
}

// policies renders the IETF RateLimit-Policy field: one item per enforced limit.
func policies(o *checker.Outcome) string {
	var p ratelimitheader.Policies
	for i := range o.Limits {
		l := &o.Limits[i]
		if !l.Rule.Shadow {
			p.Add(l.Rule.ID, l.Limit.Limit, l.Limit.Window, l.Limit.Capacity())
		}
	}
	return p.String()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"error": code, "message": msg})
}

// ParseTrustedProxies reads ForwardAuthConfig.TrustedProxies: each entry a network (CIDR) or
// an address (a network of its own), blank entries skipped. Its error is a *field.Error
// about TrustedProxies naming the entry.
func ParseTrustedProxies(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range entries {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, field.Errorf("TrustedProxies", "%q is neither a CIDR nor an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ParseDimensionHeaders reads ForwardAuthConfig.DimensionHeaders: each entry name=header
// (tenant=X-Tenant-Id), blank entries skipped. Its error is a *field.Error about
// DimensionHeaders naming the entry.
func ParseDimensionHeaders(entries []string) ([]DimensionHeader, error) {
	var out []DimensionHeader
	for _, pair := range entries {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		name, header, ok := strings.Cut(pair, "=")
		name, header = strings.TrimSpace(name), strings.TrimSpace(header)
		if !ok || name == "" || header == "" || !httpguts.ValidHeaderFieldName(header) {
			return nil, field.Errorf("DimensionHeaders", "%q is not name=header (tenant=X-Tenant-Id)", pair)
		}
		out = append(out, DimensionHeader{Dimension: name, Header: header})
	}
	return out, nil
}
