// Package rulestore keeps quotaflow's configuration in NATS JetStream KV, where every checker
// watches it: the rules document (rules, tiers, warning thresholds, policies) and one key per
// user in bucket QUOTAFLOW_CONFIG, and one key per temporary override, with a per-key TTL that
// ends at its expiry, in bucket QUOTAFLOW_OVERRIDES.
//
// Every write is validated against the whole configuration it would make and refused whole:
// a rule change that would not validate, or the deletion of a rule a user's limit names, leaves
// the stored configuration as it was. Concurrent writers are serialised by compare-and-swap on
// the document's revision.
//
// Every write names its actor (the admin API token's name) and, once stored, publishes one
// event on the events stream — a ConfigEvent for the rules and users (config.go), an
// OverrideEvent for overrides (overrides.go) — so that "who changed what, when" is on record;
// a refused write publishes nothing.
package rulestore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/events"
	"github.com/quotaflow/quotaflow/internal/rules"
)

// Bucket names and keys.
const (
	ConfigBucket   = "QUOTAFLOW_CONFIG"
	OverrideBucket = "QUOTAFLOW_OVERRIDES"
	rulesetKey     = "ruleset"
	userPrefix     = "users."
)

// Config configures a Store. The zero value is usable.
type Config struct {
	// Replicas of the KV buckets and the events stream (1).
	Replicas int
	// Logger receives the store's logs (discarded when nil).
	Logger *slog.Logger
}

// Store reads and writes the configuration. It is safe for concurrent use.
type Store struct {
	js        jetstream.JetStream
	config    jetstream.KeyValue
	overrides jetstream.KeyValue
	log       *slog.Logger
	now       func() time.Time
}

// Open creates or updates the buckets and the events stream, each with cfg.Replicas replicas.
// While the NATS servers cannot create them yet (JetStream starting, a cluster electing its
// leader or with servers still joining), it retries, logging, until ctx ends
// (broker.Ensure). Replicas the servers cannot hold fail with a *broker.ReplicasError.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Store, error) {
	replicas := max(1, cfg.Replicas)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ensure := broker.EnsureConfig{Replicas: replicas}
	var config, overrides jetstream.KeyValue
	err := broker.Ensure(ctx, log, "rule store: config bucket", ensure, func(ctx context.Context) (err error) {
		config, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: ConfigBucket, Description: "quotaflow rules document and users", History: 5, Replicas: replicas,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	err = broker.Ensure(ctx, log, "rule store: overrides bucket", ensure, func(ctx context.Context) (err error) {
		overrides, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: OverrideBucket, Description: "quotaflow temporary overrides, one key each, expiring by TTL",
			History: 1, Replicas: replicas, LimitMarkerTTL: time.Hour,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	err = broker.Ensure(ctx, log, "rule store: events stream", ensure, func(ctx context.Context) error {
		_, err := events.EnsureStream(ctx, js, replicas)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Store{js: js, config: config, overrides: overrides, log: log, now: time.Now}, nil
}

// UserKey is the KV key of a user: user ids may hold any UTF-8, keys may not.
func UserKey(id string) string {
	return userPrefix + base64.RawURLEncoding.EncodeToString([]byte(id))
}

func userID(key string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(key, userPrefix))
	return string(b), err == nil && strings.HasPrefix(key, userPrefix)
}

// snapshot is the whole configuration at one moment.
type snapshot struct {
	doc       *rules.Document
	rev       uint64 // of the ruleset key
	users     map[string]rules.DocUser
	overrides []rules.Override
}

func (sn *snapshot) compile() (*rules.Set, error) {
	set, err := sn.doc.CompileWithUsers(sn.users)
	if err != nil {
		return nil, err
	}
	return set.WithOverrides(sn.overrides), nil
}

// read loads the whole configuration.
func (s *Store) read(ctx context.Context) (*snapshot, error) {
	sn := &snapshot{users: map[string]rules.DocUser{}}
	e, err := s.config.Get(ctx, rulesetKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, rules.ErrNotSeeded
	case err != nil:
		return nil, fmt.Errorf("read rules: %w", err)
	}
	if sn.doc, err = decodeDoc(e.Value()); err != nil {
		return nil, err
	}
	sn.rev = e.Revision()
	keys, err := s.config.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	for k := range keys.Keys() {
		id, ok := userID(k)
		if !ok {
			continue
		}
		e, err := s.config.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read user %q: %w", id, err)
		}
		var u rules.DocUser
		if err := json.Unmarshal(e.Value(), &u); err != nil {
			return nil, fmt.Errorf("decode user %q: %w", id, err)
		}
		sn.users[id] = u
	}
	if err := ctx.Err(); err != nil {
		// The listing stops at ctx's end without saying so: a partial list would drop users.
		return nil, fmt.Errorf("list users: %w", err)
	}
	if sn.overrides, err = s.Overrides(ctx); err != nil {
		return nil, err
	}
	return sn, nil
}

func decodeDoc(b []byte) (*rules.Document, error) {
	var d rules.Document
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode stored rules: %w", err)
	}
	return &d, nil
}

// Current returns the configuration as a compiled set, overrides applied.
func (s *Store) Current(ctx context.Context) (*rules.Set, error) {
	sn, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	return sn.compile()
}

// Seed stores doc (its users as user keys) unless the store holds a rules document already;
// it reports whether it did. Checkers seed the store from their rules file at start, and after
// that the store wins.
//
// The seeding is no admin change, but it is the configuration every later change starts from,
// so it is recorded too: a "rules_seeded" event by SeedActor, published only by the checker
// that seeded. An event that cannot be published is logged rather than failing the seeding,
// which a checker needs to start.
func (s *Store) Seed(ctx context.Context, doc *rules.Document) (bool, error) {
	if _, err := doc.Compile(); err != nil {
		return false, err
	}
	if _, err := s.config.Get(ctx, rulesetKey); err == nil {
		return false, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, fmt.Errorf("read rules: %w", err)
	}
	for id, u := range doc.Users {
		if _, err := s.putUser(ctx, id, u); err != nil {
			return false, err
		}
	}
	data, err := json.Marshal(doc.WithoutUsers())
	if err != nil {
		return false, fmt.Errorf("encode rules: %w", err)
	}
	rev, err := s.config.Create(ctx, rulesetKey, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil // another checker seeded first
	} else if err != nil {
		return false, fmt.Errorf("seed rules: %w", err)
	}
	if err := s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigRulesSeeded, Actor: SeedActor}, doc); err != nil {
		s.log.Warn("rule store seeded, but its event was not published", "err", err)
	}
	return true, nil
}

// Apply replaces the whole configuration with doc: its rules, tiers, thresholds and policies,
// and its users (users not in doc are removed). Overrides stay; ones naming a rule or tier doc
// lacks stop applying. It publishes a "rules_applied" event by actor carrying doc.
func (s *Store) Apply(ctx context.Context, doc *rules.Document, actor string) error {
	if _, err := doc.Compile(); err != nil {
		return err
	}
	data, err := json.Marshal(doc.WithoutUsers())
	if err != nil {
		return fmt.Errorf("encode rules: %w", err)
	}
	old, err := s.read(ctx)
	if err != nil && !errors.Is(err, rules.ErrNotSeeded) {
		return err
	}
	for id, u := range doc.Users {
		if _, err := s.putUser(ctx, id, u); err != nil {
			return err
		}
	}
	rev, err := s.config.Put(ctx, rulesetKey, data)
	if err != nil {
		return fmt.Errorf("write rules: %w", err)
	}
	if old != nil {
		for id := range old.users {
			if _, keep := doc.Users[id]; !keep {
				if err := s.config.Delete(ctx, UserKey(id)); err != nil {
					return fmt.Errorf("remove user %q: %w", id, err)
				}
			}
		}
	}
	return s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigRulesApplied, Actor: actor}, doc)
}

// putUser writes a user's key and returns its revision.
func (s *Store) putUser(ctx context.Context, id string, u rules.DocUser) (uint64, error) {
	data, err := json.Marshal(u)
	if err != nil {
		return 0, fmt.Errorf("encode user %q: %w", id, err)
	}
	rev, err := s.config.Put(ctx, UserKey(id), data)
	if err != nil {
		return 0, fmt.Errorf("write user %q: %w", id, err)
	}
	return rev, nil
}

// updateDoc applies change to the stored document and writes it back if the whole
// configuration still validates, retrying when another writer came first; it returns the
// revision written.
func (s *Store) updateDoc(ctx context.Context, change func(*rules.Document) error) (uint64, error) {
	for attempt := 0; ; attempt++ {
		sn, err := s.read(ctx)
		if err != nil {
			return 0, err
		}
		if err := change(sn.doc); err != nil {
			return 0, err
		}
		if _, err := sn.doc.CompileWithUsers(sn.users); err != nil {
			return 0, err
		}
		data, err := json.Marshal(sn.doc)
		if err != nil {
			return 0, fmt.Errorf("encode rules: %w", err)
		}
		rev, err := s.config.Update(ctx, rulesetKey, data, sn.rev)
		if err == nil {
			return rev, nil
		}
		var apiErr *jetstream.APIError
		if attempt < 20 && errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // another writer changed the document: redo the change on theirs
		}
		return 0, fmt.Errorf("write rules: %w", err)
	}
}

// PutRule adds rule, or replaces the rule with its id; it reports whether the rule is new. It
// publishes a "rule_created" or "rule_replaced" event by actor carrying the rule.
func (s *Store) PutRule(ctx context.Context, rule rules.DocRule, actor string) (created bool, err error) {
	rev, err := s.updateDoc(ctx, func(d *rules.Document) error {
		created = true
		for i := range d.Rules {
			if d.Rules[i].ID == rule.ID {
				d.Rules[i], created = rule, false
				return nil
			}
		}
		d.Rules = append(d.Rules, rule)
		return nil
	})
	if err != nil {
		return false, err
	}
	action := events.ConfigRuleReplaced
	if created {
		action = events.ConfigRuleCreated
	}
	return created, s.publishConfig(ctx, rev, &events.ConfigEvent{Action: action, Actor: actor, RuleID: rule.ID}, rule)
}

// CreateRule adds rule; an id in use is refused with rules.ErrExists. It publishes a
// "rule_created" event by actor carrying the rule.
func (s *Store) CreateRule(ctx context.Context, rule rules.DocRule, actor string) error {
	rev, err := s.updateDoc(ctx, func(d *rules.Document) error {
		for i := range d.Rules {
			if d.Rules[i].ID == rule.ID {
				return fmt.Errorf("rule %q: %w", rule.ID, rules.ErrExists)
			}
		}
		d.Rules = append(d.Rules, rule)
		return nil
	})
	if err != nil {
		return err
	}
	return s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigRuleCreated, Actor: actor, RuleID: rule.ID}, rule)
}

// DeleteRule removes the rule with the given id. It publishes a "rule_deleted" event by actor
// carrying the rule removed.
func (s *Store) DeleteRule(ctx context.Context, id, actor string) error {
	var removed rules.DocRule
	rev, err := s.updateDoc(ctx, func(d *rules.Document) error {
		for i := range d.Rules {
			if d.Rules[i].ID == id {
				removed = d.Rules[i]
				d.Rules = append(d.Rules[:i], d.Rules[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("rule %q: %w", id, rules.ErrNotFound)
	})
	if err != nil {
		return err
	}
	return s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigRuleDeleted, Actor: actor, RuleID: id}, removed)
}

// SetUserTier sets a user's tier, keeping the user's custom limits. It publishes a
// "user_tier_set" event by actor carrying the user as stored.
func (s *Store) SetUserTier(ctx context.Context, id, tier, actor string) error {
	sn, err := s.read(ctx)
	if err != nil {
		return err
	}
	u := sn.users[id]
	u.Tier = tier
	sn.users[id] = u
	if _, err := sn.doc.CompileWithUsers(sn.users); err != nil {
		return err
	}
	rev, err := s.putUser(ctx, id, u)
	if err != nil {
		return err
	}
	return s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigUserTierSet, Actor: actor, UserID: id, Tier: tier}, u)
}
