package transport

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// forwardAuth serves gateways (nginx auth_request, Traefik ForwardAuth, Envoy ext_authz over
// HTTP): the subjects and endpoint come from headers, the answer is 200 or 429 with the
// X-RateLimit-*, Retry-After and IETF RateLimit fields and the JSON body the README's "The check API" describes.
func (s *Server) forwardAuth(w http.ResponseWriter, r *http.Request) {
	q, err := forwardAuthQuery(r)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
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
	if d := out.Deciding(); d != nil {
		body.RuleID, body.Limit, body.Remaining, body.ResetAt, body.State = d.RuleId, d.Burst, d.Remaining, d.ResetAt, stateName(out.State())
		h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Burst, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetAt, 10))
		h.Set("X-RateLimit-State", body.State)
		reset := checker.CeilMillis(out.DecidingLimit().Result.ResetAt.Sub(out.Now))
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", d.RuleId, d.Remaining, checker.CeilSeconds(max(0, reset))))
		h.Set("RateLimit-Policy", policies(out))
		if !out.Allowed {
			secs := checker.CeilSeconds(d.RetryAfterMs)
			body.RetryAfter = &secs
			h.Set("Retry-After", strconv.FormatInt(secs, 10))
		}
	}
	if out.Degraded {
		h.Set("X-RateLimit-Degraded", "true")
	}
	status := http.StatusOK
	if !out.Allowed {
		status = http.StatusTooManyRequests
		body.Error = "rate_limit_exceeded"
		body.Message = fmt.Sprintf("Too many requests. Please retry after %d seconds.", *body.RetryAfter)
	}
	writeJSON(w, status, body)
}

// forwardAuthBody is the forward-auth answer the README's "The check API" describes, with the error fields on a denial.
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
func forwardAuthQuery(r *http.Request) (*checker.Query, error) {
	h, qs := r.Header, r.URL.Query()
	ip := h.Get("X-Client-Ip")
	if ip == "" {
		ip = h.Get("X-Real-Ip")
	}
	if ip == "" {
		ip, _, _ = strings.Cut(h.Get("X-Forwarded-For"), ",")
		ip = strings.TrimSpace(ip)
	}
	q := &checker.Query{Subjects: make([]checker.Subject, 0, 3)}
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
		if err := checker.CheckText(s.header, s.value, checker.MaxIdentifierLen); err != nil {
			return nil, err
		}
		q.Subjects = append(q.Subjects, checker.Subject{Dimension: s.dim, ID: s.value})
	}
	if len(q.Subjects) == 0 {
		return nil, checker.FieldErrorf("X-User-Id", "no subject: send at least one of X-User-Id, X-Client-Ip (or X-Real-Ip, X-Forwarded-For) and X-Api-Key")
	}
	field, ep := "X-Forwarded-Uri", h.Get("X-Forwarded-Uri")
	if ep == "" {
		field, ep = "X-Original-URI", h.Get("X-Original-URI")
	}
	if ep == "" {
		field, ep = "endpoint", qs.Get("endpoint")
	}
	ep, _, _ = strings.Cut(ep, "?")
	if err := checker.CheckText(field, ep, checker.MaxEndpointLen); err != nil {
		return nil, err
	}
	q.Endpoint = ep
	cost := h.Get("X-RateLimit-Cost")
	if cost == "" {
		cost = qs.Get("cost")
	}
	if cost != "" {
		n, err := strconv.ParseInt(cost, 10, 64)
		if err != nil {
			return nil, checker.FieldErrorf("cost", "want a whole number, got %q", cost)
		}
		q.Cost = n
	}
	var err error
	if q.Cost, err = checker.CheckCost(q.Cost); err != nil {
		return nil, err
	}
	q.IdempotencyKey = h.Get("X-Idempotency-Key")
	if q.IdempotencyKey == "" {
		q.IdempotencyKey = h.Get("Idempotency-Key")
	}
	if q.IdempotencyKey != "" {
		if err := checker.CheckText("X-Idempotency-Key", q.IdempotencyKey, checker.MaxIdempotentLen); err != nil {
			return nil, err
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
	var b strings.Builder
	for i := range o.Limits {
		l := &o.Limits[i]
		if l.Rule.Shadow {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q;q=%d;w=%d", l.Rule.ID, l.Limit.Limit, max(1, int64(l.Limit.Window/time.Second)))
		if l.Limit.Capacity() != l.Limit.Limit {
			fmt.Fprintf(&b, ";burst=%d", l.Limit.Capacity())
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
