package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/field"
)

// Audit reads what the aggregators recorded in ClickHouse (audit.Reader): the usage series,
// the subjects throttled most, a subject's billing period and recent decisions. Its errors
// are a *field.Error for a request that broke a rule (answered 400), the context's, or
// ClickHouse's (503).
type Audit interface {
	Series(ctx context.Context, req audit.SeriesRequest) (*audit.Series, error)
	Top(ctx context.Context, req audit.TopRequest) ([]audit.SubjectRow, error)
	Billing(ctx context.Context, req audit.BillingRequest) (*audit.Billing, error)
	Recent(ctx context.Context, subject string, n int) ([]audit.Decision, error)
	Ping(ctx context.Context) error
}

var _ Audit = (*audit.Reader)(nil)

// auditAnswer renders an Audit call's result: its field errors as every field error (400),
// ClickHouse's as 503 naming it.
func auditAnswer(v any, err error) (int, any, error) {
	if fe := (*field.Error)(nil); err == nil || errors.As(err, &fe) {
		return http.StatusOK, v, err
	}
	return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: err.Error()}
}

func (a *API) needAudit() error {
	if a.audit == nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "usage is read from the ClickHouse audit: start the checker with --audit-clickhouse-dsn"}
	}
	return nil
}

// spanParam reads a span query parameter: 1h, 24h, 30d (days are not Go durations).
func spanParam(r *http.Request, name string) (time.Duration, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, badField(name, "%q is no span (1h, 24h, 30d)", v)
	}
	return d, nil
}

// boolParam reads an optional boolean query parameter (false when absent).
func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badField(name, "%q is no boolean (true or false)", v)
	}
	return b, nil
}

// intParam reads an optional integer query parameter (0 when absent).
func intParam(r *http.Request, name string) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, badField(name, "%q is no integer", v)
	}
	return n, nil
}

// usage answers GET /api/v1/usage?by=tier|rule&span=1h: checks by outcome per tier or rule
// over the span, from the usage rollups.
func (a *API) usage(r *http.Request, _ caller) (int, any, error) {
	if err := a.needAudit(); err != nil {
		return 0, nil, err
	}
	span, err := spanParam(r, "span")
	if err != nil {
		return 0, nil, err
	}
	by := r.URL.Query().Get("by")
	if by == "" {
		by = "tier"
	}
	s, err := a.audit.Series(r.Context(), audit.SeriesRequest{By: by, Span: span})
	return auditAnswer(s, err)
}

// topSubjects answers GET /api/v1/usage/top?span=1h&n=10&tier=&rule=: the subjects denied
// most by their limits over the span.
func (a *API) topSubjects(r *http.Request, _ caller) (int, any, error) {
	if err := a.needAudit(); err != nil {
		return 0, nil, err
	}
	span, err := spanParam(r, "span")
	if err != nil {
		return 0, nil, err
	}
	n, err := intParam(r, "n")
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	top, err := a.audit.Top(r.Context(), audit.TopRequest{Span: span, N: n, Tier: q.Get("tier"), Rule: q.Get("rule")})
	return auditAnswer(top, err)
}

// subjectDecisions answers GET /api/v1/subjects/{subject}/decisions?n=50: the subject's
// latest checks of the last day, from the audit.
func (a *API) subjectDecisions(r *http.Request, _ caller) (int, any, error) {
	if err := a.needAudit(); err != nil {
		return 0, nil, err
	}
	n, err := intParam(r, "n")
	if err != nil {
		return 0, nil, err
	}
	ds, err := a.audit.Recent(r.Context(), r.PathValue("subject"), n)
	return auditAnswer(ds, err)
}

// subjectBilling answers GET /api/v1/subjects/{subject}/billing?month=2026-11&tz=Europe/Paris:
// the subject's checks per day of a calendar month in a time zone (UTC when none), as JSON
// or, with format=csv, as CSV.
func (a *API) subjectBilling(r *http.Request, _ caller) (int, any, error) {
	if err := a.needAudit(); err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	format := q.Get("format")
	if format != "" && format != "json" && format != "csv" {
		return 0, nil, badField("format", "%q is not json or csv", format)
	}
	loc := time.UTC
	if tz := q.Get("tz"); tz != "" {
		var err error
		if loc, err = time.LoadLocation(tz); err != nil || tz == "Local" {
			return 0, nil, badField("tz", "%q is no IANA time zone (Europe/Paris)", tz)
		}
	}
	b, err := a.audit.Billing(r.Context(), audit.BillingRequest{Subject: r.PathValue("subject"), Month: q.Get("month"), Location: loc})
	if err == nil && format == "csv" {
		return http.StatusOK, csvBody{b}, nil
	}
	return auditAnswer(b, err)
}

// subjectLimit is one limit of a subject as a peek sees it now.
type subjectLimit struct {
	RuleID    string           `json:"rule_id"`
	Endpoint  string           `json:"endpoint"`
	Algorithm string           `json:"algorithm"`
	Window    string           `json:"window"`
	Limit     int64            `json:"limit"`
	Burst     int64            `json:"burst"`
	Shadow    bool             `json:"shadow,omitempty"`
	Used      int64            `json:"used"`
	Remaining int64            `json:"remaining"`
	ResetAt   time.Time        `json:"reset_at"`
	State     string           `json:"state"`
	Overrides []rules.Override `json:"overrides,omitempty"`
}

// subjectLimits is GET /api/v1/subjects/{subject}/limits's answer.
type subjectLimits struct {
	Subject  string         `json:"subject"`
	Endpoint string         `json:"endpoint"`
	Tier     string         `json:"tier"`
	Limits   []subjectLimit `json:"limits"`
	// Degraded: Redis did not answer, and the limits show the fail modes' answers.
	Degraded bool `json:"degraded,omitempty"`
}

// subjectLimits answers GET /api/v1/subjects/{subject}/limits?endpoint=/v1/items: the limits
// a check of the subject (user, ip or api_key) at the endpoint meets, with what is left of
// each — a peek, which charges nothing.
func (a *API) subjectLimits(r *http.Request, _ caller) (int, any, error) {
	subject := r.PathValue("subject")
	dim, id, _ := strings.Cut(subject, ":")
	d, ok := map[string]rules.Dimension{"user": rules.DimensionUser, "ip": rules.DimensionIP, "api_key": rules.DimensionAPIKey}[dim]
	if !ok || id == "" || len(id) > checker.MaxIdentifierLen {
		return 0, nil, badField("subject", "%q is not user:, ip: or api_key: and 1 to %d bytes", subject, checker.MaxIdentifierLen)
	}
	endpoint := r.URL.Query().Get("endpoint")
	if endpoint == "" {
		endpoint = "/"
	}
	out, err := a.engine.Peek(r.Context(), &checker.Query{Subjects: []checker.Subject{{Dimension: d, ID: id}}, Endpoint: endpoint})
	if err != nil {
		return 0, nil, err
	}
	set, now := a.engine.Rules(), time.Now()
	res := subjectLimits{Subject: subject, Endpoint: endpoint, Tier: out.Tier, Limits: []subjectLimit{}, Degraded: out.Degraded}
	for i := range out.Limits {
		l := &out.Limits[i]
		res.Limits = append(res.Limits, subjectLimit{RuleID: l.Rule.ID, Endpoint: l.Rule.Endpoint, Algorithm: l.Rule.Algorithm.String(),
			Window: l.Rule.WindowName(), Limit: l.Limit.Limit, Burst: l.Limit.Capacity(), Shadow: l.Rule.Shadow,
			Used: l.Result.Used, Remaining: l.Result.Remaining, ResetAt: l.Result.ResetAt.UTC(), State: l.State().String(),
			Overrides: applyingOverrides(set, l.Rule, l.Subject.ID, out.Tier, now)})
	}
	return http.StatusOK, res, nil
}

// partHealth is one dependency as this checker sees it.
type partHealth struct {
	OK bool `json:"ok"`
	// Configured is false when the checker runs without it (then OK is false too).
	Configured bool   `json:"configured"`
	Error      string `json:"error,omitempty"`
}

// healthTimeout bounds each dependency's probe: the console asks every few seconds.
const healthTimeout = 2 * time.Second

// health answers GET /api/v1/health: Redis, NATS and ClickHouse as this checker sees them,
// and the health reports of every process, for the console's banners and process list. It
// always answers 200: a dependency down is its content.
func (a *API) health(r *http.Request, _ caller) (int, any, error) {
	probe := func(configured bool, f func(context.Context) error) partHealth {
		if !configured {
			return partHealth{Error: "not configured"}
		}
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		if err := f(ctx); err != nil {
			return partHealth{Configured: true, Error: err.Error()}
		}
		return partHealth{OK: true, Configured: true}
	}
	out := healthAnswer{
		Redis: probe(true, a.engine.Ready),
		NATS: probe(a.js != nil, func(ctx context.Context) error {
			_, err := a.js.AccountInfo(ctx)
			return err
		}),
		ClickHouse: probe(a.audit != nil, func(ctx context.Context) error { return a.audit.Ping(ctx) }),
		Processes:  []health.Report{},
	}
	if out.NATS.OK {
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		if ps, err := health.List(ctx, a.js); err == nil && ps != nil {
			out.Processes = ps
		}
	}
	return http.StatusOK, out, nil
}

// healthAnswer is GET /api/v1/health's answer: this checker's view of its dependencies, and
// every checker's and aggregator's own (health.List), empty while NATS is unreachable.
type healthAnswer struct {
	Redis      partHealth      `json:"redis"`
	NATS       partHealth      `json:"nats"`
	ClickHouse partHealth      `json:"clickhouse"`
	Processes  []health.Report `json:"processes"`
}
