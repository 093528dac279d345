package rulestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
)

// seedActor is the actor of the event that records a store's seeding from a rules file.
const seedActor = "seed"

// maxDetail bounds an event's detail: a whole rules document with many users could exceed what
// NATS takes in one message (1 MiB by default), and the write it records must not fail for it.
const maxDetail = 256 << 10

// configEvent builds the event of a configuration write: ev's action, actor and target, the
// write's instant, and detail as compact JSON. Its id is the write's revision in the config
// bucket, unique to the write: publishing the event again makes a copy the stream drops and the
// aggregator does not store.
func configEvent(ev *events.ConfigEvent, rev uint64, at time.Time, detail any) (*events.ConfigEvent, error) {
	data, err := json.Marshal(detail)
	if err != nil {
		return nil, fmt.Errorf("encode %s detail: %w", ev.Action, err)
	}
	if len(data) > maxDetail {
		// A digest still tells whether two applied documents were the same.
		sum := sha256.Sum256(data)
		data, _ = json.Marshal(struct {
			Truncated bool   `json:"truncated"`
			Bytes     int    `json:"bytes"`
			SHA256    string `json:"sha256"`
		}{true, len(data), hex.EncodeToString(sum[:])})
	}
	out := *ev
	out.ID = fmt.Sprintf("config-%s-%d", ev.Action, rev)
	out.At = at.UTC()
	out.Detail = data
	return &out, nil
}

// publishConfig publishes the event of a stored configuration write. The write stands when the
// event cannot be published; the error says so, so that the caller knows the audit misses it.
func (s *Store) publishConfig(ctx context.Context, rev uint64, change *events.ConfigEvent, detail any) error {
	ev, err := configEvent(change, rev, s.now(), detail)
	if err == nil {
		err = events.Publish(ctx, s.js, ev.NATSSubject(), ev.ID, ev)
	}
	if err != nil {
		return fmt.Errorf("configuration changed, but its event was not published: %w", err)
	}
	return nil
}

// RecordGrant publishes the event of a grant made or voided (events.ConfigGrantIssued,
// ConfigGrantVoided) by actor, carrying the grant and what the ledger needs of it. A grant
// lives with its balance in Redis, not in the config bucket, so the event's id is not a
// revision's but the grant's and the action's: a write retried is recorded once (within the
// stream's duplicate window).
func (s *Store) RecordGrant(ctx context.Context, action, actor string, d events.GrantDetail) error {
	g := d.Grant
	// The event's instant is the grant's own (made, voided), not the call's: a retry long
	// after is the same event at the same instant, which the aggregator finds stored (its
	// lookup reads the events' instants), so that the ledger counts a grant and a void once.
	at := s.now()
	switch {
	case action == events.ConfigGrantVoided && !g.VoidedAt.IsZero():
		at = g.VoidedAt
	case action == events.ConfigGrantIssued && !g.CreatedAt.IsZero():
		at = g.CreatedAt
	}
	ev, err := configEvent(&events.ConfigEvent{Action: action, Actor: actor, GrantID: g.ID}, 0, at, d)
	if err == nil {
		sum := sha256.Sum256([]byte(g.Entitlement + "\x00" + g.Dimension + "\x00" + g.Subject + "\x00" + g.ID))
		ev.ID = "config-" + action + "-" + hex.EncodeToString(sum[:12])
		err = events.Publish(ctx, s.js, ev.NATSSubject(), ev.ID, ev)
	}
	if err != nil {
		return fmt.Errorf("grant changed, but its event was not published: %w", err)
	}
	return nil
}
