package rulestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

// PutOverride validates o against the current configuration and stores it until its expiry,
// then publishes its "created" event. An id in use is refused with rules.ErrExists, so that an
// automatic policy that names its overrides deterministically never makes one twice.
func (s *Store) PutOverride(ctx context.Context, o rules.Override) error {
	set, err := s.ruleSet(ctx)
	if err != nil {
		return err
	}
	if err := set.ValidateOverride(&o); err != nil {
		return err
	}
	ttl := time.Until(o.ExpiresAt)
	if ttl < time.Second {
		return &field.Error{Field: "duration", Msg: "the override would expire within a second"}
	}
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("encode override: %w", err)
	}
	if _, err := s.overrides.Create(ctx, o.ID, data, jetstream.KeyTTL(ttl.Round(time.Second)+time.Second)); errors.Is(err, jetstream.ErrKeyExists) {
		// A retry of a create that was stored but not answered (its NATS server died), or whose
		// event was not published: the stored override stands, and its "created" event is
		// published again — its id makes a copy a duplicate the stream drops. Another change
		// under the same id is a conflict.
		if stored, gerr := s.Override(ctx, o.ID); gerr == nil && sameChange(stored, o) {
			return s.publishOverride(ctx, events.OverrideCreated, stored.Creator, stored.CreatedAt, stored)
		}
		return fmt.Errorf("override %q: %w", o.ID, rules.ErrExists)
	} else if err != nil {
		return fmt.Errorf("store override: %w", err)
	}
	return s.publishOverride(ctx, events.OverrideCreated, o.Creator, o.CreatedAt, o)
}

// sameChange reports whether two overrides make the same change, whenever each was made.
func sameChange(a, b rules.Override) bool {
	a.CreatedAt, a.ExpiresAt, b.CreatedAt, b.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}

// DeleteOverride removes an override before its expiry and publishes its "deleted" event.
func (s *Store) DeleteOverride(ctx context.Context, id, actor string) error {
	o, err := s.Override(ctx, id)
	if err != nil {
		return err
	}
	if err := s.overrides.Delete(ctx, id); err != nil {
		return fmt.Errorf("delete override %q: %w", id, err)
	}
	return s.publishOverride(ctx, events.OverrideDeleted, actor, s.now(), o)
}

// RenewOverride moves the expiry of the override with the given id to expires, in place, and
// publishes its "renewed" event. Renewing rather than making a second override is what keeps an
// automatic policy's multiplier from compounding with its own previous one (0.5 × 0.5). The
// write is a compare-and-swap on the key's revision with a new per-key TTL, so a renewal that
// races a deletion or the key's expiry fails with rules.ErrNotFound instead of bringing the
// override back.
func (s *Store) RenewOverride(ctx context.Context, id string, expires time.Time, actor string) error {
	o, rev, err := s.override(ctx, id)
	if err != nil {
		return err
	}
	ttl := time.Until(expires)
	switch {
	case ttl < time.Second:
		return &field.Error{Field: "duration", Msg: "the override would expire within a second"}
	case expires.Sub(o.CreatedAt) > rules.MaxOverrideDuration:
		return &field.Error{Field: "duration", Msg: fmt.Sprintf("at most %s", rules.MaxOverrideDuration)}
	}
	o.ExpiresAt = expires
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("encode override: %w", err)
	}
	// KeyValue.Update takes no TTL: publish to the key's subject as Update does, with the TTL
	// header Create sets.
	_, err = s.js.Publish(ctx, "$KV."+OverrideBucket+"."+id, data,
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl.Round(time.Second)+time.Second))
	if err != nil {
		if casFailed(err) {
			return fmt.Errorf("override %q changed while renewed: %w", id, rules.ErrNotFound)
		}
		return fmt.Errorf("renew override %q: %w", id, err)
	}
	return s.publishOverride(ctx, events.OverrideRenewed, actor, s.now(), o)
}

// Override returns the override with the given id.
func (s *Store) Override(ctx context.Context, id string) (rules.Override, error) {
	o, _, err := s.override(ctx, id)
	return o, err
}

// override returns the override with the given id and its key's revision.
func (s *Store) override(ctx context.Context, id string) (rules.Override, uint64, error) {
	return readOverride(ctx, s.overrides, id)
}

// readOverride returns the override of kv with the given id and its key's revision.
func readOverride(ctx context.Context, kv jetstream.KeyValue, id string) (rules.Override, uint64, error) {
	var o rules.Override
	e, err := kv.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return o, 0, fmt.Errorf("override %q: %w", id, rules.ErrNotFound)
	case err != nil:
		return o, 0, fmt.Errorf("read override %q: %w", id, err)
	}
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		return o, 0, fmt.Errorf("decode override %q: %w", id, err)
	}
	return o, e.Revision(), nil
}

// Overrides returns the overrides not yet expired.
func (s *Store) Overrides(ctx context.Context) ([]rules.Override, error) {
	return listOverrides(ctx, s.overrides, s.now())
}

// ReadOverrides returns the overrides not yet expired without opening the store: a reader
// (quotaflow status) creates nothing on the server. No override bucket yet is no override.
func ReadOverrides(ctx context.Context, js jetstream.JetStream) ([]rules.Override, error) {
	kv, err := js.KeyValue(ctx, OverrideBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("override bucket: %w", err)
	}
	return listOverrides(ctx, kv, time.Now())
}

// listOverrides returns the overrides of kv not yet expired at now.
func listOverrides(ctx context.Context, kv jetstream.KeyValue, now time.Time) ([]rules.Override, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list overrides: %w", err)
	}
	var out []rules.Override
	for k := range keys.Keys() {
		o, _, err := readOverride(ctx, kv, k)
		if errors.Is(err, rules.ErrNotFound) {
			continue // expired or deleted since listed
		} else if err != nil {
			return nil, err
		}
		if o.ExpiresAt.After(now) {
			out = append(out, o)
		}
	}
	if err := ctx.Err(); err != nil {
		// The listing stops at ctx's end without saying so: a partial list would drop overrides.
		return nil, fmt.Errorf("list overrides: %w", err)
	}
	return out, nil
}

// publishOverride sends an override event; its id makes a repeated publication of the same
// change a duplicate the stream drops.
func (s *Store) publishOverride(ctx context.Context, action, actor string, at time.Time, o rules.Override) error {
	ev := OverrideEvent(action, actor, at, o)
	return events.Publish(ctx, s.js, ev.NATSSubject(), ev.ID, ev)
}

// OverrideEvent builds the event of an override change. An override's "created" and
// "expired" events are ids of the override alone; a deletion's carries its instant; a
// renewal's carries the expiry it set, so each renewal is on record once.
func OverrideEvent(action, actor string, at time.Time, o rules.Override) *events.OverrideEvent {
	id := fmt.Sprintf("override-%s-%s-%d", action, o.ID, o.CreatedAt.UnixMicro())
	if action == events.OverrideRenewed {
		id += fmt.Sprintf("-%d", o.ExpiresAt.UnixMicro())
	}
	return &events.OverrideEvent{ID: id, Action: action, At: at.UTC(), Actor: actor, Override: o}
}

// ruleSet is the stored rules document compiled alone, without its users and overrides: what
// an override is validated against (its rule and tier). Reading every user and override for
// each put made a policy's thousand puts cost a million reads.
func (s *Store) ruleSet(ctx context.Context) (*rules.Set, error) {
	e, _, err := s.getDoc(ctx)
	if err != nil {
		return nil, err
	}
	doc, _, err := decodeDoc(e.Value())
	if err != nil {
		return nil, err
	}
	return doc.Compile()
}
