package checker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/grpcreflect"

	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"

	"github.com/quotaflow/quotaflow/internal/rules"
)

// Handler serves everything on one port: the RateLimiter service over Connect, gRPC and
// gRPC-Web, Envoy's RateLimitService (RLS v3), gRPC reflection and health, GET /ratelimit/check for gateways, /healthz and /readyz,
// and the admin REST API under /api/v1.
// Serve it with HTTP/1.1 and h2c enabled for gRPC clients.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(quotaflowv1connect.NewRateLimiterHandler(s))
	mux.Handle(s.RLSHandler())
	mux.Handle((&healthService{s: s}).handler())
	reflector := grpcreflect.NewStaticReflector(quotaflowv1connect.RateLimiterName, healthServiceName, RLSServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.HandleFunc("/ratelimit/check", s.forwardAuth)
	s.admin.register(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.Ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// forwardAuth serves gateways (nginx auth_request, Traefik ForwardAuth, Envoy ext_authz over
// HTTP): the subjects and endpoint come from headers, the answer is 200 or 429 with the
// X-RateLimit-*, Retry-After and IETF RateLimit fields and seed 003's JSON body.
func (s *Server) forwardAuth(w http.ResponseWriter, r *http.Request) {
	q, err := forwardAuthQuery(r)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	out, err := s.decide(r.Context(), q, false)
	if err != nil {
		status, code := http.StatusServiceUnavailable, "unavailable"
		if isFieldError(err) {
			status, code = http.StatusBadRequest, "invalid_argument"
		}
		writeJSONError(w, status, code, err.Error())
		return
	}
	h := w.Header()
	body := forwardAuthBody{Allowed: out.allowed, Tier: out.tier, Degraded: out.degraded, DecisionID: out.id}
	w.Header().Set("X-Quotaflow-Decision-Id", out.id)
	if d := out.deciding(); d != nil {
		body.RuleID, body.Limit, body.Remaining, body.ResetAt, body.State = d.RuleId, d.Burst, d.Remaining, d.ResetAt, stateName(out.state())
		h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Burst, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetAt, 10))
		h.Set("X-RateLimit-State", body.State)
		reset := ceilMillis(out.limits[out.decider].res.ResetAt.Sub(out.now))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", d.RuleId, d.Remaining, ceilSeconds(max(0, reset))))
		h.Set("RateLimit-Policy", out.policies())
		if !out.allowed {
			secs := ceilSeconds(d.RetryAfterMs)
			body.RetryAfter = &secs
			h.Set("Retry-After", strconv.FormatInt(secs, 10))
		}
	}
	if out.degraded {
		h.Set("X-RateLimit-Degraded", "true")
	}
	status := http.StatusOK
	if !out.allowed {
		status = http.StatusTooManyRequests
		body.Error = "rate_limit_exceeded"
		body.Message = fmt.Sprintf("Too many requests. Please retry after %d seconds.", *body.RetryAfter)
	}
	writeJSON(w, status, body)
}

// forwardAuthBody is seed 003's check response, with the error fields on a denial.
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
}

// forwardAuthQuery reads a check from gateway headers. The client IP is X-Client-Ip, else
// X-Real-Ip, else the first X-Forwarded-For entry; the endpoint is X-Forwarded-Uri, else
// X-Original-URI, else ?endpoint=, without its query string.
func forwardAuthQuery(r *http.Request) (*query, error) {
	h, qs := r.Header, r.URL.Query()
	ip := h.Get("X-Client-Ip")
	if ip == "" {
		ip = h.Get("X-Real-Ip")
	}
	if ip == "" {
		ip, _, _ = strings.Cut(h.Get("X-Forwarded-For"), ",")
		ip = strings.TrimSpace(ip)
	}
	q := &query{subjects: make([]subject, 0, 3)}
	for _, s := range []struct {
		header string
		dim    rules.Dimension
		value  string
	}{
		{"X-User-Id", rules.DimensionUser, h.Get("X-User-Id")},
		{"X-Client-Ip", rules.DimensionIP, ip},
		{"X-Api-Key", rules.DimensionAPIKey, h.Get("X-Api-Key")},
	} {
		if s.value == "" {
			continue
		}
		if err := checkText(s.header, s.value, MaxIdentifierLen); err != nil {
			return nil, err
		}
		q.subjects = append(q.subjects, subject{s.dim, s.value})
	}
	if len(q.subjects) == 0 {
		return nil, fieldErr("X-User-Id", "no subject: send at least one of X-User-Id, X-Client-Ip (or X-Real-Ip, X-Forwarded-For) and X-Api-Key")
	}
	field, ep := "X-Forwarded-Uri", h.Get("X-Forwarded-Uri")
	if ep == "" {
		field, ep = "X-Original-URI", h.Get("X-Original-URI")
	}
	if ep == "" {
		field, ep = "endpoint", qs.Get("endpoint")
	}
	ep, _, _ = strings.Cut(ep, "?")
	if err := checkText(field, ep, MaxEndpointLen); err != nil {
		return nil, err
	}
	q.endpoint = ep
	cost := h.Get("X-RateLimit-Cost")
	if cost == "" {
		cost = qs.Get("cost")
	}
	if cost != "" {
		n, err := strconv.ParseInt(cost, 10, 64)
		if err != nil {
			return nil, fieldErr("cost", "want a whole number, got %q", cost)
		}
		q.cost = n
	}
	var err error
	if q.cost, err = checkCost(q.cost); err != nil {
		return nil, err
	}
	q.idemKey = h.Get("X-Idempotency-Key")
	if q.idemKey == "" {
		q.idemKey = h.Get("Idempotency-Key")
	}
	if q.idemKey != "" {
		if err := checkText("X-Idempotency-Key", q.idemKey, MaxIdempotentLen); err != nil {
			return nil, err
		}
	}
	q.tier = h.Get("X-RateLimit-Tier")
	if q.tier == "" {
		q.tier = qs.Get("tier")
	}
	return q, nil
}

// policies renders the IETF RateLimit-Policy field: one item per enforced limit.
func (o *outcome) policies() string {
	var b strings.Builder
	for i := range o.limits {
		l := &o.limits[i]
		if l.rule.Shadow {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q;q=%d;w=%d", l.rule.ID, l.limit.Limit, max(1, int64(l.limit.Window/time.Second)))
		if l.limit.Capacity() != l.limit.Limit {
			fmt.Fprintf(&b, ";burst=%d", l.limit.Capacity())
		}
	}
	return b.String()
}

func stateName(s interface{ String() string }) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "STATE_"))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"error": code, "message": msg})
}
