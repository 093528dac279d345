package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/audit"
	"github.com/quotaflow/quotaflow/internal/bearer"
)

// Client calls the admin API of a checker. The zero value needs BaseURL and Token.
type Client struct {
	// BaseURL is the checker's base URL, e.g. http://127.0.0.1:8080.
	BaseURL string
	// Token is the bearer token.
	Token string
	// HTTP is the client to call with; nil means http.DefaultClient.
	HTTP *http.Client
}

// Do sends body (as JSON, when not nil) to method path and decodes the answer into out (when
// not nil). An error the API answers is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, rd)
	if err != nil {
		return fmt.Errorf("base url: %w", err)
	}
	req.Header.Set("Authorization", bearer.Header(c.Token))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		ae := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Message == "" {
			return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
		}
		return ae
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// Rules returns the rule store's whole rules document, as JSON.
func (c *Client) Rules(ctx context.Context) (json.RawMessage, error) {
	var raw json.RawMessage
	return raw, c.Do(ctx, http.MethodGet, "/api/v1/rules", nil, &raw)
}

// Rule returns one rule, as JSON.
func (c *Client) Rule(ctx context.Context, id string) (json.RawMessage, error) {
	var raw json.RawMessage
	return raw, c.Do(ctx, http.MethodGet, "/api/v1/rules/"+url.PathEscape(id), nil, &raw)
}

// ApplyRules replaces the rules, tiers, users and policies with doc, and returns how many rules
// and users it holds and what changed. What the store holds and doc lacks is removed only with
// opts.Prune: without it the call fails with an *Error of code failed_precondition whose
// Problems name each item; opts.DryRun changes nothing.
func (c *Client) ApplyRules(ctx context.Context, doc *rules.Document, opts rules.ApplyOptions) (ApplyResult, error) {
	var out ApplyResult
	path := "/api/v1/rules"
	if opts.Prune || opts.DryRun {
		path += fmt.Sprintf("?prune=%t&dry_run=%t", opts.Prune, opts.DryRun)
	}
	err := c.Do(ctx, http.MethodPut, path, doc, &out)
	return out, err
}

// ApplyRulesFile is ApplyRules of the rules file at path (YAML or JSON), checked here first:
// only here do its problems have the file's lines, and are they said once (the API's error
// lists them in its message and again). A file with a problem changes nothing.
func (c *Client) ApplyRulesFile(ctx context.Context, path string, opts rules.ApplyOptions) (ApplyResult, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return ApplyResult{}, fmt.Errorf("read rules file: %w", err)
	}
	doc, err := rules.Decode(data)
	if err != nil {
		return ApplyResult{}, fmt.Errorf("rules file %s: %w", path, err)
	}
	if _, err := doc.Compile(); err != nil {
		return ApplyResult{}, fmt.Errorf("rules file %s: refused, nothing was changed: %w", path, err)
	}
	return c.ApplyRules(ctx, doc, opts)
}

// DeleteRule removes a rule.
func (c *Client) DeleteRule(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/api/v1/rules/"+url.PathEscape(id), nil, nil)
}

// CreateOverride creates an override and returns it.
func (c *Client) CreateOverride(ctx context.Context, req OverrideRequest) (rules.Override, error) {
	var o rules.Override
	return o, c.Do(ctx, http.MethodPost, "/api/v1/overrides", req, &o)
}

// Overrides lists the overrides not yet expired.
func (c *Client) Overrides(ctx context.Context) ([]rules.Override, error) {
	var out struct{ Overrides []rules.Override }
	return out.Overrides, c.Do(ctx, http.MethodGet, "/api/v1/overrides", nil, &out)
}

// DeleteOverride removes an override before its expiry.
func (c *Client) DeleteOverride(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/api/v1/overrides/"+url.PathEscape(id), nil, nil)
}

// SetUserTier moves a user to a tier.
func (c *Client) SetUserTier(ctx context.Context, user, tier string) error {
	return c.Do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(user)+"/tier", map[string]string{"tier": tier}, nil)
}

// SetUserOrg makes a user a member of org ("" for none).
func (c *Client) SetUserOrg(ctx context.Context, user, org string) error {
	return c.Do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(user)+"/org", map[string]string{"org": org}, nil)
}

// SetUserZone sets a user's time zone (an IANA name) and monthly anchor day for calendar
// quotas; "" and 0 leave them to the user's tier and the rules.
func (c *Client) SetUserZone(ctx context.Context, user, timezone string, anchorDay int) error {
	return c.Do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(user)+"/timezone",
		map[string]any{"timezone": timezone, "anchor_day": anchorDay}, nil)
}

// Exemptions lists the exemptions of the rules document.
func (c *Client) Exemptions(ctx context.Context) ([]rules.DocExemption, error) {
	var out struct{ Exemptions []rules.DocExemption }
	return out.Exemptions, c.Do(ctx, http.MethodGet, "/api/v1/exemptions", nil, &out)
}

// PutExemption creates or replaces the exemption with e's id.
func (c *Client) PutExemption(ctx context.Context, e rules.DocExemption) error {
	return c.Do(ctx, http.MethodPut, "/api/v1/exemptions/"+url.PathEscape(e.ID), e, nil)
}

// DeleteExemption removes an exemption.
func (c *Client) DeleteExemption(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/api/v1/exemptions/"+url.PathEscape(id), nil, nil)
}

// CreateGrant makes a grant and answers it with its holder's balance after.
func (c *Client) CreateGrant(ctx context.Context, g rules.Grant) (GrantResult, error) {
	var out GrantResult
	err := c.Do(ctx, http.MethodPost, "/api/v1/grants", g, &out)
	return out, err
}

// Grants answers subject's balance of entitlement and its grants.
func (c *Client) Grants(ctx context.Context, entitlement, subject string) (BalanceView, error) {
	var out BalanceView
	q := url.Values{"entitlement": {entitlement}, "subject": {subject}}
	err := c.Do(ctx, http.MethodGet, "/api/v1/grants?"+q.Encode(), nil, &out)
	return out, err
}

// VoidGrant voids grant id of subject's balance of entitlement.
func (c *Client) VoidGrant(ctx context.Context, entitlement, subject, id string) (GrantResult, error) {
	var out GrantResult
	body := map[string]string{"entitlement": entitlement, "subject": subject}
	err := c.Do(ctx, http.MethodPost, "/api/v1/grants/"+url.PathEscape(id)+"/void", body, &out)
	return out, err
}

// WebhookRequest sets a webhook endpoint (PutWebhook): Secret empty draws one for a new
// endpoint and keeps a replaced one's.
type WebhookRequest struct {
	URL      string   `json:"url"`
	Secret   string   `json:"secret,omitempty"`
	Filter   []string `json:"filter,omitempty"`
	Disabled bool     `json:"disabled,omitempty"`
}

// PutWebhook creates or replaces endpoint id; the answer holds the secret when one was drawn
// or given.
func (c *Client) PutWebhook(ctx context.Context, id string, req WebhookRequest) (EndpointView, error) {
	var out EndpointView
	err := c.Do(ctx, http.MethodPut, "/api/v1/webhooks/"+url.PathEscape(id), req, &out)
	return out, err
}

// Webhooks lists the endpoints, their secrets masked.
func (c *Client) Webhooks(ctx context.Context) ([]EndpointView, error) {
	var out struct {
		Webhooks []EndpointView `json:"webhooks"`
	}
	err := c.Do(ctx, http.MethodGet, "/api/v1/webhooks", nil, &out)
	return out.Webhooks, err
}

// DeleteWebhook removes endpoint id.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/api/v1/webhooks/"+url.PathEscape(id), nil, nil)
}

// WebhookDeliveries returns endpoint id's latest attempts, the newest first (n: 0 for 50).
func (c *Client) WebhookDeliveries(ctx context.Context, id string, n int) ([]audit.Delivery, error) {
	var out struct {
		Deliveries []audit.Delivery `json:"deliveries"`
	}
	err := c.Do(ctx, http.MethodGet, "/api/v1/webhooks/"+url.PathEscape(id)+"/deliveries?n="+strconv.Itoa(n), nil, &out)
	return out.Deliveries, err
}
