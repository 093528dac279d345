// Package events defines quotaflow's JSON events for people and services to subscribe to —
// warning-state transitions on quotaflow.warnings.<tier>.<dimension>, override changes on
// quotaflow.overrides.<action> and configuration changes on quotaflow.config.<action> — and the
// JetStream stream that keeps them (QUOTAFLOW_EVENTS), so that the aggregator can store them in
// ClickHouse and late subscribers can replay them.
//
// Every event has a deterministic id, sent as its Nats-Msg-Id: a producer that recomputes an
// event after a crash publishes the same id, and the stream drops the copy.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/spell"
)

// Stream settings.
const (
	Stream          = "QUOTAFLOW_EVENTS"
	WarningsPrefix  = "quotaflow.warnings"
	OverridesPrefix = "quotaflow.overrides"
	ConfigPrefix    = "quotaflow.config"
	// EntitlementsPrefix is the subjects of entitlement thresholds crossed:
	// quotaflow.entitlements.<kind> (EntitlementEvent).
	EntitlementsPrefix = "quotaflow.entitlements"
	// ConsumerName is the durable consumer, shared by the aggregators, that stores the events
	// in ClickHouse. No other role may touch it (package natsauth).
	ConsumerName = "quotaflow-aggregator-events"
	// DuplicateWindow is how long the stream remembers event ids to drop re-published copies.
	DuplicateWindow = 10 * time.Minute
	// MaxAge is how long the stream keeps events (ClickHouse keeps them longer).
	MaxAge = 7 * 24 * time.Hour
)

// The states of the warning state machine (docs/warnings.md).
const (
	StateNormal    = "normal"
	StateWarning   = "warning"
	StateThrottled = "throttled"
)

// Transition is a subject's warning state changing on one rule.
type Transition struct {
	ID         string    `json:"id"`
	Tier       string    `json:"tier"`
	Dimension  string    `json:"dimension"`
	Subject    string    `json:"subject"`
	RuleID     string    `json:"rule_id"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	UsageRatio float64   `json:"usage_ratio"`
	Limit      int64     `json:"limit"`
	Remaining  int64     `json:"remaining"`
	WindowMs   int64     `json:"window_ms"`
	At         time.Time `json:"at"`
	// Cause is what made the change: "decision" or "timer".
	Cause string `json:"cause"`
}

// NATSSubject is the transition's subject: quotaflow.warnings.<tier>.<dimension>.
func (t *Transition) NATSSubject() string {
	return WarningsPrefix + "." + token(t.Tier) + "." + token(t.Dimension)
}

// String is the transition as one line, for people watching the stream (quotaflow watch
// warnings).
func (t *Transition) String() string {
	return fmt.Sprintf("%s %-10s %-24s %-16s %-9s → %-9s usage=%.2f %d/%d window=%s cause=%s id=%s",
		t.At.UTC().Format("2006-01-02 15:04:05.000000"), t.Tier, t.Dimension+":"+t.Subject, t.RuleID, t.From, t.To,
		t.UsageRatio, t.Remaining, t.Limit, spell.Duration(time.Duration(t.WindowMs)*time.Millisecond), t.Cause, t.ID)
}

// The override actions.
const (
	OverrideCreated = "created"
	OverrideDeleted = "deleted"
	OverrideExpired = "expired"
	// OverrideRenewed: an override's expiry moved later, in place (an automatic policy keeping
	// its override in force); Override carries the new expiry.
	OverrideRenewed = "renewed"
)

// OverrideEvent is an override created, renewed, deleted or expired.
type OverrideEvent struct {
	ID       string         `json:"id"`
	Action   string         `json:"action"`
	At       time.Time      `json:"at"`
	Actor    string         `json:"actor"`
	Override rules.Override `json:"override"`
}

// NATSSubject is the event's subject: quotaflow.overrides.<action>.
func (e *OverrideEvent) NATSSubject() string { return OverridesPrefix + "." + e.Action }

// String is the event as one line, for people watching the stream (quotaflow watch overrides).
func (e *OverrideEvent) String() string {
	o := e.Override
	return fmt.Sprintf("%s %-7s %-20s %-32s %-12s until %s by %s (%s) reason=%q",
		e.At.UTC().Format("2006-01-02 15:04:05"), strings.ToUpper(e.Action), o.ID, OverrideTarget(&o), OverrideChange(&o),
		o.ExpiresAt.UTC().Format("2006-01-02 15:04:05"), e.Actor, o.Source, o.Reason)
}

// OverrideTarget is what an override applies to, spelled as every view of overrides spells it
// (these events, quotaflow override and quotaflow status), so that an operator matches them by
// eye: a subject (user:alice), a tier (tier:free) or a rule (rule:r), and a subject's or
// tier's narrowed to one rule (user:alice rule:r).
func OverrideTarget(o *rules.Override) string {
	var t string
	switch o.Target() {
	case "subject":
		t = o.Dimension + ":" + o.Identifier
	case "tier":
		t = "tier:" + o.Tier
	default:
		return "rule:" + o.RuleID
	}
	if o.RuleID != "" {
		t += " rule:" + o.RuleID
	}
	return t
}

// OverrideChange is what an override does to the limit, in the spelling OverrideTarget's
// views share: limit=200 replaces it, limit×0.5 scales it.
func OverrideChange(o *rules.Override) string {
	if o.Multiplier != 0 {
		return "limit×" + strconv.FormatFloat(o.Multiplier, 'g', -1, 64)
	}
	return "limit=" + strconv.FormatInt(o.Limit, 10)
}

// The configuration change actions: every write of the rule store but overrides, which have
// events of their own.
const (
	ConfigRulesApplied = "rules_applied" // the whole document replaced (PUT /api/v1/rules)
	ConfigRulesSeeded  = "rules_seeded"  // an empty store seeded from a checker's rules file
	ConfigRuleCreated  = "rule_created"
	ConfigRuleReplaced = "rule_replaced"
	ConfigRuleDeleted  = "rule_deleted"
	ConfigUserTierSet  = "user_tier_set"
	ConfigUserZoneSet  = "user_zone_set" // a user's time zone and anchor day for calendar quotas
	ConfigUserOrgSet   = "user_org_set"  // a user's organisation, for org rules
	// ConfigExemptionSet and ConfigExemptionDeleted are an exemption created or replaced, and
	// removed (PUT and DELETE /api/v1/exemptions/{id}).
	ConfigExemptionSet     = "exemption_set"
	ConfigExemptionDeleted = "exemption_deleted"
	// A grant of an entitlement made or voided (POST /api/v1/grants, .../void): grants live
	// with the balances in Redis, not in the config bucket, and are audited all the same.
	ConfigGrantIssued = "grant_issued"
	ConfigGrantVoided = "grant_voided"
)

// ConfigEvent is a change of the stored configuration — the rules document, a rule, a user's
// tier — with who made it: the admin API token's name, or "seed" for the seeding of an empty
// store from a rules file.
type ConfigEvent struct {
	ID     string    `json:"id"`
	Action string    `json:"action"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	// RuleID is the rule created, replaced or deleted; UserID and Tier the user whose tier was
	// set and that tier.
	RuleID string `json:"rule_id,omitempty"`
	UserID string `json:"user_id,omitempty"`
	Tier   string `json:"tier,omitempty"`
	// ExemptionID is the exemption set or deleted.
	ExemptionID string `json:"exemption_id,omitempty"`
	// GrantID is the grant made or voided (its entitlement and holder are in Detail).
	GrantID string `json:"grant_id,omitempty"`
	// WebhookID is the webhook endpoint set or deleted (its URL and filter in Detail; never
	// its secret).
	WebhookID string `json:"webhook_id,omitempty"`
	// Removed names what a whole document's apply removed ("rule orders", "user 42",
	// "exemption acme"; rules.Changes), which only an apply told to prune does.
	Removed []string `json:"removed,omitempty"`
	// Detail is what was written, as compact JSON: the rule (for a deletion the rule removed),
	// the user, or the whole document (a summary when the document is too large for an event).
	Detail json.RawMessage `json:"detail,omitempty"`
}

// NATSSubject is the event's subject: quotaflow.config.<action>.
func (e *ConfigEvent) NATSSubject() string { return ConfigPrefix + "." + token(e.Action) }

// Target is what the change is about: the rule's id, the user's id, the exemption's id, the
// grant's id, or "" for the whole document.
func (e *ConfigEvent) Target() string {
	switch {
	case e.RuleID != "":
		return e.RuleID
	case e.ExemptionID != "":
		return e.ExemptionID
	case e.GrantID != "":
		return e.GrantID
	case e.WebhookID != "":
		return e.WebhookID
	}
	return e.UserID
}

// String is the event as one line, for people watching the stream (quotaflow watch config).
func (e *ConfigEvent) String() string {
	target := "document"
	switch {
	case e.RuleID != "":
		target = "rule " + e.RuleID
	case e.ExemptionID != "":
		target = "exemption " + e.ExemptionID
	case e.GrantID != "":
		target = "grant " + e.GrantID
	case e.WebhookID != "":
		target = "webhook " + e.WebhookID
	case e.UserID != "":
		target = "user " + e.UserID + " tier=" + e.Tier
	}
	line := fmt.Sprintf("%s %-13s %-32s by %s id=%s",
		e.At.UTC().Format("2006-01-02 15:04:05"), strings.ToUpper(e.Action), target, e.Actor, e.ID)
	if len(e.Removed) > 0 {
		line += " removed=" + strings.Join(e.Removed, ",")
	}
	return line
}

// token makes s safe as one NATS subject token.
func token(s string) string {
	if s == "" {
		return "_"
	}
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r <= ' ' {
			return '_'
		}
		return r
	}, s)
}

// Subjects are the subjects of every event kind, as the stream takes them.
func Subjects() []string {
	return []string{WarningsPrefix + ".>", OverridesPrefix + ".>", ConfigPrefix + ".>", EntitlementsPrefix + ".>"}
}

// EnsureStream creates or updates the events stream; an existing stream of an older version
// gets the subjects of the event kinds it lacks.
func EnsureStream(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        Stream,
		Description: "quotaflow warning transitions, override changes and configuration changes",
		Subjects:    Subjects(),
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      MaxAge,
		Duplicates:  DuplicateWindow,
		Replicas:    max(1, replicas),
	})
	if err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	return st, nil
}

// Publish sends one event to the stream with its id as Nats-Msg-Id and waits for the stream to
// keep it. A duplicate of an event already kept is not an error.
func Publish(ctx context.Context, js jetstream.JetStream, subject, id string, event any) error {
	data, err := json.Marshal(event)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", id, err)
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, id)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish event %s: %w", id, err)
	}
	return nil
}

// Kind tells a stream message's event kind from its subject: "warning", "override", "config"
// or "entitlement".
func Kind(subject string) (string, error) {
	switch {
	case strings.HasPrefix(subject, EntitlementsPrefix+"."):
		return "entitlement", nil
	case strings.HasPrefix(subject, WarningsPrefix+"."):
		return "warning", nil
	case strings.HasPrefix(subject, OverridesPrefix+"."):
		return "override", nil
	case strings.HasPrefix(subject, ConfigPrefix+"."):
		return "config", nil
	}
	return "", errors.New("not an event subject: " + subject)
}
