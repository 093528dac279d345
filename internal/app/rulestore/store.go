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
// A whole document (Apply, Seed) switches in one write, so that no watcher ever enforces half
// of it: its users are written first under keys of a new generation, which the stored
// document does not name yet, and the document naming that generation is written last; the
// old generation's keys are removed after. A watcher reads the users of the generation its
// document names, and the stream's order delivers all of them before the document.
//
// Every write names its actor (the admin API token's name) and, once stored, publishes one
// event on the events stream — a ConfigEvent for the rules and users (config.go), an
// OverrideEvent for overrides (overrides.go) — so that "who changed what, when" is on record;
// a refused write publishes nothing.
package rulestore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/broker"
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
	// Bind opens the buckets as they are, never creating or updating them nor the events
	// stream: for a role whose NATS credentials may not (package natsauth). Until the admin
	// API's process has created them, Open waits.
	Bind bool
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
	if cfg.Bind {
		return bind(ctx, js, log)
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

// bind opens the buckets that exist, waiting (as Ensure does) while they do not yet.
func bind(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*Store, error) {
	var config, overrides jetstream.KeyValue
	err := broker.Ensure(ctx, log, "rule store: bind the buckets", broker.EnsureConfig{}, func(ctx context.Context) (err error) {
		if config, err = js.KeyValue(ctx, ConfigBucket); err == nil {
			overrides, err = js.KeyValue(ctx, OverrideBucket)
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			// Not an error of this process: the admin API's has not created them yet.
			return fmt.Errorf("%w (not created yet: the admin API's process creates them)", nats.ErrTimeout)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Store{js: js, config: config, overrides: overrides, log: log, now: time.Now}, nil
}

// userKey is the KV key of a user of generation gen: users.<gen>.<id in base64>, user ids may
// hold any UTF-8, keys may not. Generation "" is that of stores written before generations:
// users.<id in base64>.
func userKey(gen, id string) string {
	enc := base64.RawURLEncoding.EncodeToString([]byte(id))
	if gen == "" {
		return userPrefix + enc
	}
	return userPrefix + gen + "." + enc
}

// parseUserKey returns the generation and user id of a user key (base64 has no '.').
func parseUserKey(key string) (gen, id string, ok bool) {
	rest, ok := strings.CutPrefix(key, userPrefix)
	if !ok {
		return "", "", false
	}
	if g, enc, found := strings.Cut(rest, "."); found {
		gen, rest = g, enc
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	return gen, string(b), err == nil
}

// newGeneration returns a generation name no other write uses.
func newGeneration() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// storedDoc is the ruleset key's value: the document without its users, and the generation of
// the user keys that belong to it.
type storedDoc struct {
	rules.Document
	UsersGeneration string `json:"users_generation,omitempty"`
}

// snapshot is the whole configuration at one moment.
type snapshot struct {
	doc       *rules.Document
	gen       string // of the users
	rev       uint64 // of the ruleset key
	users     map[string]rules.DocUser
	userRevs  map[string]uint64 // of each user's key
	overrides []rules.Override
}

func (sn *snapshot) compile() (*rules.Set, error) {
	set, err := sn.doc.CompileWithUsers(sn.users)
	if err != nil {
		return nil, err
	}
	return set.WithOverrides(sn.overrides), nil
}

// read loads the whole configuration: the document and the users of its generation. A
// document that switches generation while the users are read (an Apply) makes it read again.
func (s *Store) read(ctx context.Context) (*snapshot, error) {
	for attempt := 0; ; attempt++ {
		sn, err := s.readOnce(ctx)
		if err != nil {
			return nil, err
		}
		_, gen, err := s.getDoc(ctx)
		if err != nil {
			return nil, err
		}
		if gen == sn.gen {
			return sn, nil
		}
		if attempt == 20 {
			return nil, errors.New("read rules: the document kept changing generation while its users were read")
		}
	}
}

// getDoc reads the ruleset key.
func (s *Store) getDoc(ctx context.Context) (jetstream.KeyValueEntry, string, error) {
	e, err := s.config.Get(ctx, rulesetKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, "", rules.ErrNotSeeded
	case err != nil:
		return nil, "", fmt.Errorf("read rules: %w", err)
	}
	_, gen, err := decodeDoc(e.Value())
	return e, gen, err
}

func (s *Store) readOnce(ctx context.Context) (*snapshot, error) {
	sn := &snapshot{users: map[string]rules.DocUser{}, userRevs: map[string]uint64{}}
	e, _, err := s.getDoc(ctx)
	if err != nil {
		return nil, err
	}
	if sn.doc, sn.gen, err = decodeDoc(e.Value()); err != nil {
		return nil, err
	}
	sn.rev = e.Revision()
	keys, err := s.config.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list users: %w", err)
	}
	for k := range keys.Keys() {
		gen, id, ok := parseUserKey(k)
		if !ok || gen != sn.gen {
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
		sn.users[id], sn.userRevs[id] = u, e.Revision()
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

func decodeDoc(b []byte) (*rules.Document, string, error) {
	var d storedDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, "", fmt.Errorf("decode stored rules: %w", err)
	}
	return &d.Document, d.UsersGeneration, nil
}

func encodeDoc(d *rules.Document, gen string) ([]byte, error) {
	data, err := json.Marshal(storedDoc{Document: *d.WithoutUsers(), UsersGeneration: gen})
	if err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	return data, nil
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
// so it is recorded too: a "rules_seeded" event by seedActor, published only by the checker
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
	gen, err := s.putUsers(ctx, doc.Users)
	if err != nil {
		return false, err
	}
	data, err := encodeDoc(doc, gen)
	if err != nil {
		return false, err
	}
	rev, err := s.config.Create(ctx, rulesetKey, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		s.removeGeneration(ctx, gen) // another checker seeded first
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("seed rules: %w", err)
	}
	if err := s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigRulesSeeded, Actor: seedActor}, doc); err != nil {
		s.log.Warn("rule store seeded, but its event was not published", "err", err)
	}
	return true, nil
}

// Apply replaces the whole configuration with doc: its rules, tiers, thresholds and policies,
// and its users. Overrides stay; ones naming a rule or tier doc lacks stop applying. It returns
// what changed, and publishes a "rules_applied" event by actor carrying doc and naming what it
// removed.
//
// What the store holds and doc lacks (an exemption made through the admin API, say) is removed
// only with opts.Prune: without it Apply changes nothing and fails with a *rules.RemovalError
// naming each such item, so that a file that never held them does not delete them unseen.
//
// Watchers see the old configuration, then doc, and nothing in between: doc's users are
// written under a new generation, then the document naming it, by compare-and-swap (a write
// that came between makes Apply start over); the old generation's keys are removed last.
func (s *Store) Apply(ctx context.Context, doc *rules.Document, actor string, opts rules.ApplyOptions) (rules.Changes, error) {
	if _, err := doc.Compile(); err != nil {
		return rules.Changes{}, err
	}
	for attempt := 0; ; attempt++ {
		old, err := s.read(ctx)
		if err != nil && !errors.Is(err, rules.ErrNotSeeded) {
			return rules.Changes{}, err
		}
		changes := rules.Diff(old.withUsers(), doc)
		if len(changes.Removed) > 0 && !opts.Prune {
			return changes, &rules.RemovalError{Removed: changes.Removed}
		}
		if opts.DryRun {
			return changes, nil
		}
		gen, err := s.putUsers(ctx, doc.Users)
		if err != nil {
			return changes, err
		}
		data, err := encodeDoc(doc, gen)
		if err != nil {
			return changes, err
		}
		var rev uint64
		if old == nil {
			rev, err = s.config.Create(ctx, rulesetKey, data)
		} else {
			rev, err = s.config.Update(ctx, rulesetKey, data, old.rev)
		}
		if err != nil {
			// Nothing names the new generation: its keys are garbage.
			s.removeGeneration(ctx, gen)
			if attempt < 20 && casFailed(err) {
				continue // another writer came first: compare with theirs and replace it
			}
			return changes, fmt.Errorf("write rules: %w", err)
		}
		if old != nil {
			s.removeGeneration(ctx, old.gen)
		}
		ev := &events.ConfigEvent{Action: events.ConfigRulesApplied, Actor: actor, Removed: changes.Removed}
		return changes, s.publishConfig(ctx, rev, ev, doc)
	}
}

// withUsers is the stored document with its users, as an applied one holds them; nil for no
// snapshot (an empty store).
func (sn *snapshot) withUsers() *rules.Document {
	if sn == nil {
		return nil
	}
	d := *sn.doc
	d.Users = sn.users
	return &d
}

// casFailed reports whether a compare-and-swap write failed because the key changed.
func casFailed(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// putUsers writes users under a new generation and returns it.
func (s *Store) putUsers(ctx context.Context, users map[string]rules.DocUser) (string, error) {
	gen := newGeneration()
	for id, u := range users {
		if _, err := s.putUser(ctx, gen, id, u); err != nil {
			s.removeGeneration(ctx, gen)
			return "", err
		}
	}
	return gen, nil
}

// removeGeneration removes the user keys of generation gen, which no document names any more
// (or ever did). Leftovers are logged, not failed: they are unreferenced, and the write that
// made them obsolete is done.
func (s *Store) removeGeneration(ctx context.Context, gen string) {
	keys, err := s.config.ListKeys(ctx)
	if err != nil {
		s.log.Warn("the keys of unreferenced users were not removed", "generation", gen, "err", err)
		return
	}
	for k := range keys.Keys() {
		if g, _, ok := parseUserKey(k); ok && g == gen {
			s.removeKey(ctx, k)
		}
	}
}

func (s *Store) removeKey(ctx context.Context, key string) {
	if err := s.config.Delete(ctx, key); err != nil {
		s.log.Warn("an unreferenced user key was not removed", "key", key, "err", err)
	}
}

// putUser writes a user's key of generation gen and returns its revision.
func (s *Store) putUser(ctx context.Context, gen, id string, u rules.DocUser) (uint64, error) {
	data, err := json.Marshal(u)
	if err != nil {
		return 0, fmt.Errorf("encode user %q: %w", id, err)
	}
	rev, err := s.config.Put(ctx, userKey(gen, id), data)
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
		data, err := encodeDoc(sn.doc, sn.gen)
		if err != nil {
			return 0, err
		}
		rev, err := s.config.Update(ctx, rulesetKey, data, sn.rev)
		if err == nil {
			return rev, nil
		}
		if attempt < 20 && casFailed(err) {
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

// PutExemption adds exemption e, or replaces the exemption with its id; it reports whether e
// is new. It publishes an "exemption_set" event by actor carrying e. The document with it must
// compile (a rule it names must exist).
func (s *Store) PutExemption(ctx context.Context, e rules.DocExemption, actor string) (created bool, err error) {
	rev, err := s.updateDoc(ctx, func(d *rules.Document) error {
		created = true
		for i := range d.Exemptions {
			if d.Exemptions[i].ID == e.ID {
				d.Exemptions[i], created = e, false
				return nil
			}
		}
		d.Exemptions = append(d.Exemptions, e)
		return nil
	})
	if err != nil {
		return false, err
	}
	return created, s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigExemptionSet, Actor: actor, ExemptionID: e.ID}, e)
}

// DeleteExemption removes the exemption with the given id (rules.ErrNotFound for none). It
// publishes an "exemption_deleted" event by actor carrying the exemption removed.
func (s *Store) DeleteExemption(ctx context.Context, id, actor string) error {
	var removed rules.DocExemption
	rev, err := s.updateDoc(ctx, func(d *rules.Document) error {
		for i := range d.Exemptions {
			if d.Exemptions[i].ID == id {
				removed = d.Exemptions[i]
				d.Exemptions = append(d.Exemptions[:i], d.Exemptions[i+1:]...)
				return nil
			}
		}
		return fmt.Errorf("exemption %q: %w", id, rules.ErrNotFound)
	})
	if err != nil {
		return err
	}
	return s.publishConfig(ctx, rev, &events.ConfigEvent{Action: events.ConfigExemptionDeleted, Actor: actor, ExemptionID: id}, removed)
}

// SetUserTier sets a user's tier, keeping the user's custom limits. It publishes a
// "user_tier_set" event by actor carrying the user as stored.
//
// The user's key is written by compare-and-swap, and the change is redone when an Apply
// replaced the users meanwhile (it would be written to a generation no document names).
func (s *Store) SetUserTier(ctx context.Context, id, tier, actor string) error {
	return s.updateUser(ctx, id, func(u *rules.DocUser) { u.Tier = tier },
		&events.ConfigEvent{Action: events.ConfigUserTierSet, Actor: actor, UserID: id, Tier: tier})
}

// SetUserZone sets a user's time zone (an IANA name) and monthly anchor day for calendar
// quotas, either empty (or 0) to leave it to the user's tier and the rules; it validates the
// whole configuration with the change first, so that a zone the rules cannot load is refused
// like any other invalid document (a *rules.Error naming the user and field).
func (s *Store) SetUserZone(ctx context.Context, id, timezone string, anchorDay int, actor string) error {
	anchor := rules.Scalar("")
	if anchorDay != 0 {
		anchor = rules.Scalar(strconv.Itoa(anchorDay))
	}
	return s.updateUser(ctx, id, func(u *rules.DocUser) { u.Timezone, u.AnchorDay = timezone, anchor },
		&events.ConfigEvent{Action: events.ConfigUserZoneSet, Actor: actor, UserID: id})
}

// SetUserOrg makes a user a member of org (empty: of none), whose org rules then count the
// user's checks too.
func (s *Store) SetUserOrg(ctx context.Context, id, org, actor string) error {
	return s.updateUser(ctx, id, func(u *rules.DocUser) { u.Org = org },
		&events.ConfigEvent{Action: events.ConfigUserOrgSet, Actor: actor, UserID: id})
}

// updateUser applies change to user id, validates the configuration with it, writes it and
// publishes ev (its Tier set to the user's).
func (s *Store) updateUser(ctx context.Context, id string, change func(*rules.DocUser), ev *events.ConfigEvent) error {
	for attempt := 0; ; attempt++ {
		sn, err := s.read(ctx)
		if err != nil {
			return err
		}
		u := sn.users[id]
		change(&u)
		sn.users[id] = u
		if _, err := sn.doc.CompileWithUsers(sn.users); err != nil {
			return err
		}
		data, err := json.Marshal(u)
		if err != nil {
			return fmt.Errorf("encode user %q: %w", id, err)
		}
		var rev uint64
		if r, ok := sn.userRevs[id]; ok {
			rev, err = s.config.Update(ctx, userKey(sn.gen, id), data, r)
		} else {
			rev, err = s.config.Create(ctx, userKey(sn.gen, id), data)
		}
		if err == nil {
			_, gen, gerr := s.getDoc(ctx)
			if gerr != nil {
				return gerr
			}
			if gen == sn.gen {
				ev.Tier = u.Tier
				return s.publishConfig(ctx, rev, ev, u)
			}
			// Written to the generation an Apply just replaced: unreferenced, do it again.
			s.removeKey(ctx, userKey(sn.gen, id))
		} else if !casFailed(err) {
			return fmt.Errorf("write user %q: %w", id, err)
		}
		if attempt == 20 {
			return fmt.Errorf("write user %q: it kept changing while being written", id)
		}
	}
}
