package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// The webhook endpoints that entitlement events are delivered to: set and deleted with a write
// token (each an audited config event, without its secret), listed with a read token (their
// secrets masked), and their delivery log read from ClickHouse.

// Webhooks is the store of webhook endpoints (rulestore.Webhooks).
type Webhooks interface {
	Endpoints(ctx context.Context) ([]webhook.Endpoint, error)
	Endpoint(ctx context.Context, id string) (webhook.Endpoint, uint64, error)
	PutEndpoint(ctx context.Context, ep webhook.Endpoint, actor string) (created bool, err error)
	DeleteEndpoint(ctx context.Context, id, actor string) error
}

// Deliveries reads the webhook delivery log (audit.Reader).
type Deliveries interface {
	Deliveries(ctx context.Context, endpoint string, n int) ([]audit.Delivery, error)
}

var _ Deliveries = (*audit.Reader)(nil)

// EndpointView is a webhook endpoint as the API answers it: its secret shown whole only in
// the answer that set or drew it, else as a hint (its prefix and last four characters).
type EndpointView struct {
	ID         string   `json:"id"`
	URL        string   `json:"url"`
	Filter     []string `json:"filter,omitempty"`
	Disabled   bool     `json:"disabled,omitempty"`
	Secret     string   `json:"secret,omitempty"`
	SecretHint string   `json:"secret_hint"`
}

func endpointView(ep webhook.Endpoint, withSecret bool) EndpointView {
	text := ep.Secret.Text()
	v := EndpointView{ID: ep.ID, URL: ep.URL, Filter: ep.Filter, Disabled: ep.Disabled, SecretHint: webhook.SecretPrefix + "…"}
	if len(text) > 4 {
		v.SecretHint += text[len(text)-4:]
	}
	if withSecret {
		v.Secret = text
	}
	return v
}

func (a *API) needWebhooks() error {
	if a.webhooks == nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "webhooks: this process has no NATS rule store"}
	}
	return nil
}

// listWebhooks lists the endpoints (GET /api/v1/webhooks).
func (a *API) listWebhooks(r *http.Request, _ caller) (int, any, error) {
	if err := a.needWebhooks(); err != nil {
		return 0, nil, err
	}
	eps, err := a.webhooks.Endpoints(r.Context())
	if err != nil {
		return 0, nil, err
	}
	out := make([]EndpointView, 0, len(eps))
	for _, ep := range eps {
		out = append(out, endpointView(ep, false))
	}
	return http.StatusOK, struct {
		Webhooks []EndpointView `json:"webhooks"`
	}{out}, nil
}

// putWebhook creates or replaces an endpoint (PUT /api/v1/webhooks/{id}). A new endpoint
// without a secret gets one drawn at random, answered once; a replaced one without a secret
// keeps its own.
func (a *API) putWebhook(r *http.Request, c caller) (int, any, error) {
	if err := a.needWebhooks(); err != nil {
		return 0, nil, err
	}
	var body struct {
		URL      string   `json:"url"`
		Secret   string   `json:"secret"`
		Filter   []string `json:"filter"`
		Disabled bool     `json:"disabled"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	ep := webhook.Endpoint{ID: r.PathValue("id"), URL: body.URL, Filter: body.Filter, Disabled: body.Disabled, Since: time.Now()}
	if body.Secret != "" {
		var err error
		if ep.Secret, err = webhook.ParseSecret(body.Secret); err != nil {
			return 0, nil, err // a *field.Error naming secret
		}
	}
	shown := !ep.Secret.IsZero()
	if ep.Secret.IsZero() {
		old, _, err := a.webhooks.Endpoint(r.Context(), ep.ID)
		switch {
		case err == nil:
			ep.Secret, ep.Since = old.Secret, old.Since
		case errors.Is(err, rules.ErrNotFound):
			if ep.Secret, err = webhook.NewSecret(); err != nil {
				return 0, nil, err
			}
			shown = true
		default:
			return 0, nil, err
		}
	}
	if err := ep.Validate(a.webhookPolicy); err != nil {
		return 0, nil, err
	}
	created, err := a.webhooks.PutEndpoint(r.Context(), ep, c.Name)
	if err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: webhook endpoint set", "token", c.Name, "endpoint", ep.ID, "url", ep.URL, "created", created)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return status, endpointView(ep, shown), nil
}

// deleteWebhook removes an endpoint (DELETE /api/v1/webhooks/{id}); its undelivered events go
// with it.
func (a *API) deleteWebhook(r *http.Request, c caller) (int, any, error) {
	if err := a.needWebhooks(); err != nil {
		return 0, nil, err
	}
	id := r.PathValue("id")
	if err := a.webhooks.DeleteEndpoint(r.Context(), id, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: webhook endpoint deleted", "token", c.Name, "endpoint", id)
	return http.StatusNoContent, nil, nil
}

// webhookDeliveries answers an endpoint's delivery log (GET /api/v1/webhooks/{id}/deliveries).
func (a *API) webhookDeliveries(r *http.Request, _ caller) (int, any, error) {
	if a.deliveries == nil {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "deliveries: this process has no ClickHouse"}
	}
	n := 0
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			return 0, nil, badField("n", "%q is not a number", s)
		}
		n = v
	}
	ds, err := a.deliveries.Deliveries(r.Context(), r.PathValue("id"), n)
	return auditAnswer(struct {
		Deliveries []audit.Delivery `json:"deliveries"`
	}{ds}, err)
}
