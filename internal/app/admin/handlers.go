package admin

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
)

// The rules handlers read the store, not the enforced set, so that a write is visible to the
// next read at once, before every checker has caught up.

func (a *API) getRules(r *http.Request, _ caller) (int, any, error) {
	set, err := a.store.Current(r.Context())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, set.Document(), nil
}

// applyRules replaces the whole configuration (quotaflow rules apply -f).
// ApplyResult is the answer to PUT /api/v1/rules: the document's size and what it added,
// changed and removed (with dry_run, would have).
type ApplyResult struct {
	Rules  int  `json:"rules"`
	Users  int  `json:"users"`
	DryRun bool `json:"dry_run"`
	rules.Changes
}

// applyRules answers PUT /api/v1/rules[?prune=true][&dry_run=true]: the whole configuration
// replaced by the body's document. Without prune, a document lacking what the store holds is
// refused (409, each item named).
func (a *API) applyRules(r *http.Request, c caller) (int, any, error) {
	var opts rules.ApplyOptions
	var err error
	if opts.Prune, err = boolParam(r, "prune"); err != nil {
		return 0, nil, err
	}
	if opts.DryRun, err = boolParam(r, "dry_run"); err != nil {
		return 0, nil, err
	}
	var doc rules.Document
	if err := decodeBody(r, &doc); err != nil {
		return 0, nil, err
	}
	changes, err := a.store.Apply(r.Context(), &doc, c.Name, opts)
	if err != nil {
		return 0, nil, err
	}
	if !opts.DryRun {
		a.log.Info("admin: rules applied", "token", c.Name, "rules", len(doc.Rules), "users", len(doc.Users),
			"added", len(changes.Added), "changed", len(changes.Changed), "removed", changes.Removed)
	}
	return http.StatusOK, ApplyResult{Rules: len(doc.Rules), Users: len(doc.Users), DryRun: opts.DryRun, Changes: changes}, nil
}

func (a *API) getRule(r *http.Request, _ caller) (int, any, error) {
	set, err := a.store.Current(r.Context())
	if err != nil {
		return 0, nil, err
	}
	id := r.PathValue("rule_id")
	for _, dr := range set.Document().Rules {
		if dr.ID == id {
			return http.StatusOK, dr, nil
		}
	}
	return 0, nil, notFound("no rule has id %q", id)
}

func (a *API) createRule(r *http.Request, c caller) (int, any, error) {
	var dr rules.DocRule
	if err := decodeBody(r, &dr); err != nil {
		return 0, nil, err
	}
	if dr.ID == "" {
		return 0, nil, badField("id", "required")
	}
	// Created only if the id is free when the store writes: two admins creating one id never
	// replace each other's rule.
	if err := a.store.CreateRule(r.Context(), dr, c.Name); errors.Is(err, rules.ErrExists) {
		return 0, nil, &Error{Status: http.StatusConflict, Code: "already_exists", Field: "id",
			Message: "id: rule " + dr.ID + " exists; PUT /api/v1/rules/" + dr.ID + " replaces it"}
	} else if err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: rule created", "token", c.Name, "rule", dr.ID, "limit", dr.Limit, "window", dr.Window)
	return http.StatusCreated, dr, nil
}

func (a *API) putRule(r *http.Request, c caller) (int, any, error) {
	var dr rules.DocRule
	if err := decodeBody(r, &dr); err != nil {
		return 0, nil, err
	}
	id := r.PathValue("rule_id")
	switch dr.ID {
	case "":
		dr.ID = id
	case id:
	default:
		return 0, nil, badField("id", "%q differs from the id in the path (%q)", dr.ID, id)
	}
	created, err := a.store.PutRule(r.Context(), dr, c.Name)
	if err != nil {
		return 0, nil, err
	}
	status, verb := http.StatusOK, "replaced"
	if created {
		status, verb = http.StatusCreated, "created"
	}
	a.log.Info("admin: rule "+verb, "token", c.Name, "rule", dr.ID, "limit", dr.Limit, "window", dr.Window)
	return status, dr, nil
}

func (a *API) deleteRule(r *http.Request, c caller) (int, any, error) {
	id := r.PathValue("rule_id")
	if err := a.store.DeleteRule(r.Context(), id, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: rule deleted", "token", c.Name, "rule", id)
	return http.StatusNoContent, nil, nil
}

func (a *API) setTier(r *http.Request, c caller) (int, any, error) {
	var body struct {
		Tier string `json:"tier"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	set, err := a.store.Current(r.Context())
	if err != nil {
		return 0, nil, err
	}
	if !set.HasTier(body.Tier) {
		return 0, nil, badField("tier", "%q is not a configured tier", body.Tier)
	}
	user := r.PathValue("user_id")
	if err := a.store.SetUserTier(r.Context(), user, body.Tier, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: user tier set", "token", c.Name, "user", user, "tier", body.Tier)
	return http.StatusOK, map[string]string{"user_id": user, "tier": body.Tier}, nil
}

// setZone is PUT /users/{user_id}/timezone: the user's own time zone and monthly anchor day
// for calendar quotas ({"timezone": "Europe/Berlin", "anchor_day": 15}; empty and 0 give them
// back to the user's tier and the rules). A change starts the user's periods anew where they
// move: a count kept under the old zone's period is not carried into the new one's.
func (a *API) setZone(r *http.Request, c caller) (int, any, error) {
	var body struct {
		Timezone  string `json:"timezone"`
		AnchorDay int    `json:"anchor_day"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Timezone != "" {
		if _, err := time.LoadLocation(body.Timezone); err != nil || body.Timezone == "Local" {
			return 0, nil, badField("timezone", "unknown time zone %q (want an IANA name such as Europe/Berlin, or UTC)", body.Timezone)
		}
	}
	if body.AnchorDay < 0 || body.AnchorDay > calendar.MaxAnchorDay {
		return 0, nil, badField("anchor_day", "want a day of the month from 1 to %d (0 for none), got %d", calendar.MaxAnchorDay, body.AnchorDay)
	}
	user := r.PathValue("user_id")
	if err := a.store.SetUserZone(r.Context(), user, body.Timezone, body.AnchorDay, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: user zone set", "token", c.Name, "user", user, "timezone", body.Timezone, "anchor_day", body.AnchorDay)
	return http.StatusOK, map[string]any{"user_id": user, "timezone": body.Timezone, "anchor_day": body.AnchorDay}, nil
}

// setOrg is PUT /users/{user_id}/org: the organisation the user belongs to ({"org": "acme"};
// "" for none), whose org rules count the user's checks from then on. What the user consumed
// stays with the org it was counted against.
func (a *API) setOrg(r *http.Request, c caller) (int, any, error) {
	var body struct {
		Org string `json:"org"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if body.Org != "" {
		if err := field.Text(body.Org, checker.MaxIdentifierLen); err != nil {
			return 0, nil, badField("org", "%v", err)
		}
	}
	user := r.PathValue("user_id")
	if err := a.store.SetUserOrg(r.Context(), user, body.Org, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: user org set", "token", c.Name, "user", user, "org", body.Org)
	return http.StatusOK, map[string]string{"user_id": user, "org": body.Org}, nil
}

// OverrideRequest is an override as POST /api/v1/overrides takes it: a target (a subject by
// Dimension and Identifier, a Tier, or with RuleID alone a rule), a new Limit or a Multiplier,
// how long it lasts (a Go duration) and why. ID is optional.
type OverrideRequest struct {
	ID         string  `json:"id,omitempty"`
	Dimension  string  `json:"dimension,omitempty"`
	Identifier string  `json:"identifier,omitempty"`
	Tier       string  `json:"tier,omitempty"`
	RuleID     string  `json:"rule_id,omitempty"`
	Limit      int64   `json:"limit,omitempty"`
	Multiplier float64 `json:"multiplier,omitempty"`
	Duration   string  `json:"duration"`
	Reason     string  `json:"reason"`
}

// userOverride is POST /users/{user_id}/override: an override of one user.
func (a *API) userOverride(r *http.Request, c caller) (int, any, error) {
	var body struct {
		ID         string  `json:"id"`
		RuleID     string  `json:"rule_id"`
		Limit      int64   `json:"limit"`
		Multiplier float64 `json:"multiplier"`
		Duration   string  `json:"duration"`
		Reason     string  `json:"reason"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	return a.putOverride(r, c, OverrideRequest{ID: body.ID, Dimension: "user", Identifier: r.PathValue("user_id"),
		RuleID: body.RuleID, Limit: body.Limit, Multiplier: body.Multiplier, Duration: body.Duration, Reason: body.Reason})
}

// createOverride is POST /overrides: an override of a subject, a tier or a rule.
func (a *API) createOverride(r *http.Request, c caller) (int, any, error) {
	var body OverrideRequest
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	return a.putOverride(r, c, body)
}

func (a *API) putOverride(r *http.Request, c caller, b OverrideRequest) (int, any, error) {
	if b.Duration == "" {
		return 0, nil, badField("duration", "required: a positive Go duration such as 10m or 24h")
	}
	d, err := time.ParseDuration(b.Duration)
	if err != nil || d <= 0 {
		return 0, nil, badField("duration", "want a positive Go duration such as 10m or 24h, got %q", b.Duration)
	}
	if b.ID == "" {
		b.ID = newOverrideID()
	}
	now := time.Now().UTC()
	o := rules.Override{ID: b.ID, Dimension: b.Dimension, Identifier: b.Identifier, Tier: b.Tier, RuleID: b.RuleID,
		Limit: b.Limit, Multiplier: b.Multiplier, Reason: b.Reason, Creator: c.Name, Source: "admin",
		CreatedAt: now, ExpiresAt: now.Add(d)}
	if err := a.store.PutOverride(r.Context(), o); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: override created", "token", c.Name, "override", o.ID, "target", o.Target(),
		"dimension", o.Dimension, "identifier", o.Identifier, "tier", o.Tier, "rule", o.RuleID,
		"limit", o.Limit, "multiplier", o.Multiplier, "expires", o.ExpiresAt, "reason", o.Reason)
	return http.StatusCreated, o, nil
}

func newOverrideID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ovr-" + hex.EncodeToString(b[:])
}

func (a *API) listOverrides(r *http.Request, _ caller) (int, any, error) {
	ovs, err := a.store.Overrides(r.Context())
	if err != nil {
		return 0, nil, err
	}
	if ovs == nil {
		ovs = []rules.Override{}
	}
	return http.StatusOK, map[string]any{"overrides": ovs}, nil
}

func (a *API) deleteOverride(r *http.Request, c caller) (int, any, error) {
	id := r.PathValue("id")
	if err := a.store.DeleteOverride(r.Context(), id, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: override deleted", "token", c.Name, "override", id)
	return http.StatusNoContent, nil, nil
}

// userLimits is the answer of GET /users/{user_id}/limits.
type userLimits struct {
	UserID string `json:"user_id"`
	Tier   string `json:"tier"`
	// Org is the user's organisation, whose org rules are listed after the user's own.
	Org    string      `json:"org,omitempty"`
	Limits []userLimit `json:"limits"`
	// QuotaError says why remaining quotas are missing (Redis unreachable).
	QuotaError string `json:"quota_error,omitempty"`
}

// userLimit is one rule as it applies to the user now.
type userLimit struct {
	RuleID string `json:"rule_id"`
	// Dimension is whose budget the limit is: the user's own ("user"), or its org's ("org",
	// shared with the org's other members).
	Dimension string `json:"dimension"`
	Endpoint  string `json:"endpoint"`
	Algorithm string `json:"algorithm"`
	Window    string `json:"window"`
	WindowMs  int64  `json:"window_ms"`
	// Timezone and AnchorDay place a calendar window's periods for this user (its own zone,
	// else its tier's, else the rule's).
	Timezone    string           `json:"timezone,omitempty"`
	AnchorDay   int              `json:"anchor_day,omitempty"`
	Shadow      bool             `json:"shadow,omitempty"`
	BaseLimit   int64            `json:"base_limit"`
	CustomLimit int64            `json:"custom_limit,omitempty"`
	Limit       int64            `json:"limit"`
	Burst       int64            `json:"burst"`
	Overrides   []rules.Override `json:"overrides,omitempty"`
	Used        *int64           `json:"used,omitempty"`
	Remaining   *int64           `json:"remaining,omitempty"`
	ResetAt     *time.Time       `json:"reset_at,omitempty"`
	// State is "normal", "warning" or "throttled", as GET /subjects/{subject}/limits names a
	// limit's: the console shows it for users as for every subject. Absent, as Used and
	// Remaining are, while the quotas cannot be peeked (QuotaError).
	State string `json:"state,omitempty"`
}

// userLimits lists the user's rules with their effective limits as this checker enforces them
// (its watched set, overrides applied) and the used and remaining quota and warning state of
// each, peeked from Redis.
func (a *API) userLimits(r *http.Request, _ caller) (int, any, error) {
	user := r.PathValue("user_id")
	if user == "" || len(user) > checker.MaxIdentifierLen {
		return 0, nil, badField("user_id", "must be 1 to %d bytes", checker.MaxIdentifierLen)
	}
	u, err := a.engine.UserUsage(r.Context(), user)
	if err != nil {
		return 0, nil, err
	}
	now := time.Now()
	set := a.engine.Rules()
	out := userLimits{UserID: user, Tier: u.Tier, Org: u.Org, Limits: []userLimit{}}
	if u.Err != nil {
		out.QuotaError = "remaining quota unknown: " + u.Err.Error()
	}
	for _, l := range u.Limits {
		rule := l.Rule
		ul := userLimit{
			RuleID: rule.ID, Dimension: rule.Dimension.String(), Endpoint: rule.Endpoint, Algorithm: rule.Algorithm.String(),
			Window: rule.WindowName(), WindowMs: rule.Window.Milliseconds(), Shadow: rule.Shadow,
			BaseLimit: rule.Limit, CustomLimit: l.Custom, Limit: l.Limit.Limit, Burst: l.Limit.Capacity(),
			Overrides: applyingOverrides(set, rule, subjectOf(rule, user, u.Org), u.Tier, now),
		}
		if rule.Calendar.Unit.Valid() {
			p := set.Period(rule, rules.DimensionUser, user, u.Tier)
			ul.Timezone, ul.AnchorDay = p.Location.String(), p.AnchorDay
		}
		if u.Err == nil {
			res := l.Result
			reset := res.ResetAt.UTC()
			ul.Used, ul.Remaining, ul.ResetAt, ul.State = &res.Used, &res.Remaining, &reset, l.State().String()
		}
		out.Limits = append(out.Limits, ul)
	}
	return http.StatusOK, out, nil
}

// applyingOverrides are the unexpired overrides that reach rule for the user: the user's own,
// the tier's and the rule's, each unless narrowed to another rule.
// subjectOf is whose budget rule counts in a user's limits view: the user's, or its org's.
func subjectOf(rule *rules.Rule, user, org string) string {
	if rule.Dimension == rules.DimensionOrg {
		return org
	}
	return user
}

func applyingOverrides(set *rules.Set, rule *rules.Rule, id, tier string, now time.Time) []rules.Override {
	var out []rules.Override
	for _, o := range set.Overrides() {
		if !o.ExpiresAt.After(now) || set.ValidateOverride(&o) != nil || o.RuleID != "" && o.RuleID != rule.ID {
			continue
		}
		switch o.Target() {
		case "subject":
			if o.Dimension != rule.Dimension.String() || o.Identifier != id {
				continue
			}
		case "tier":
			if o.Tier != tier {
				continue
			}
		}
		out = append(out, o)
	}
	return out
}

// listExemptions lists the exemptions of the rules document.
func (a *API) listExemptions(r *http.Request, _ caller) (int, any, error) {
	set, err := a.store.Current(r.Context())
	if err != nil {
		return 0, nil, err
	}
	ex := set.Document().Exemptions
	if ex == nil {
		ex = []rules.DocExemption{}
	}
	return http.StatusOK, map[string]any{"exemptions": ex}, nil
}

// putExemption creates or replaces an exemption (the path names its id).
func (a *API) putExemption(r *http.Request, c caller) (int, any, error) {
	var e rules.DocExemption
	if err := decodeBody(r, &e); err != nil {
		return 0, nil, err
	}
	id := r.PathValue("id")
	switch e.ID {
	case "":
		e.ID = id
	case id:
	default:
		return 0, nil, badField("id", "%q differs from the id in the path (%q)", e.ID, id)
	}
	created, err := a.store.PutExemption(r.Context(), e, c.Name)
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	a.log.Info("admin: exemption set", "token", c.Name, "exemption", e.ID, "dimension", e.Dimension, "value", e.Value, "rules", e.Rules)
	return status, e, nil
}

func (a *API) deleteExemption(r *http.Request, c caller) (int, any, error) {
	id := r.PathValue("id")
	if err := a.store.DeleteExemption(r.Context(), id, c.Name); err != nil {
		return 0, nil, err
	}
	a.log.Info("admin: exemption deleted", "token", c.Name, "exemption", id)
	return http.StatusNoContent, nil, nil
}
