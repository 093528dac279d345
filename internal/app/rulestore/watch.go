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
)

// initialValuesTimeout bounds how long a watch waits for the buckets' initial values.
const initialValuesTimeout = 30 * time.Second

// Watch calls apply with the compiled configuration once the store's current content is read,
// then again after every change, and at each override's expiry (so that a cache built under an
// override is dropped when it ends). It returns when ctx ends, or with an error when the
// buckets cannot be watched or their initial values do not all arrive within 30 s; a stored
// configuration that does not compile (it cannot be written so) is logged and skipped, keeping
// the last good set.
func (s *Store) Watch(ctx context.Context, apply func(*rules.Set)) error {
	cw, err := s.config.WatchAll(ctx)
	if err != nil {
		return unlessEnded(ctx, fmt.Errorf("watch config: %w", err))
	}
	defer cw.Stop()
	ow, err := s.overrides.WatchAll(ctx)
	if err != nil {
		return unlessEnded(ctx, fmt.Errorf("watch overrides: %w", err))
	}
	defer ow.Stop()

	var doc *rules.Document
	var gen string                                 // of doc's users
	users := map[string]map[string]rules.DocUser{} // by generation, then id
	overrides := map[string]rules.Override{}
	configReady, overridesReady := false, false
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	rebuild := func() {
		if !configReady || !overridesReady || doc == nil {
			return
		}
		set, err := doc.CompileWithUsers(users[gen])
		if err != nil {
			s.log.Error("stored configuration does not compile; keeping the last good one", "err", err)
			return
		}
		ovs := make([]rules.Override, 0, len(overrides))
		for _, o := range overrides {
			ovs = append(ovs, o)
		}
		set = set.WithOverrides(ovs)
		if next := set.NextExpiry(s.now()); !next.IsZero() {
			expiry.Reset(time.Until(next))
		}
		apply(set)
	}
	// A watch created while its NATS server dies may never deliver the end of its initial
	// values; the caller restarts a watch that returns.
	initial := time.NewTimer(initialValuesTimeout)
	defer initial.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-initial.C:
			if !configReady || !overridesReady {
				return fmt.Errorf("watch: the initial values did not all arrive within %v", initialValuesTimeout)
			}
		case <-expiry.C:
			rebuild()
		case e, ok := <-cw.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("config watcher stopped"))
			}
			if e == nil {
				configReady = true
				rebuild()
				continue
			}
			if e.Key() == rulesetKey {
				if e.Operation() != jetstream.KeyValuePut {
					continue // the document is replaced, never removed
				}
				d, g, err := decodeDoc(e.Value())
				if err != nil {
					s.log.Error("stored rules unreadable; keeping the last good ones", "err", err)
					continue
				}
				doc, gen = d, g
			} else if g, id, ok := parseUserKey(e.Key()); ok {
				// Users of another generation are kept for the document that will name them
				// (an Apply writes them first), and change nothing enforced yet.
				if !s.watchUser(users, g, id, e) || g != gen {
					continue
				}
			} else {
				continue
			}
			if configReady {
				rebuild()
			}
		case e, ok := <-ow.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("overrides watcher stopped"))
			}
			if e == nil {
				overridesReady = true
				rebuild()
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				delete(overrides, e.Key())
			} else {
				var o rules.Override
				if err := json.Unmarshal(e.Value(), &o); err != nil {
					s.log.Error("stored override unreadable; skipped", "override", e.Key(), "err", err)
					continue
				}
				overrides[e.Key()] = o
			}
			if overridesReady {
				rebuild()
			}
		}
	}
}

// watchUser records a user key's change in users; it reports false for a value it cannot read.
func (s *Store) watchUser(users map[string]map[string]rules.DocUser, gen, id string, e jetstream.KeyValueEntry) bool {
	if e.Operation() != jetstream.KeyValuePut {
		delete(users[gen], id)
		if len(users[gen]) == 0 {
			delete(users, gen)
		}
		return true
	}
	var u rules.DocUser
	if err := json.Unmarshal(e.Value(), &u); err != nil {
		s.log.Error("stored user unreadable; skipped", "user", id, "err", err)
		return false
	}
	if users[gen] == nil {
		users[gen] = map[string]rules.DocUser{}
	}
	users[gen][id] = u
	return true
}

// PublishExpiries publishes an "expired" event for every override whose TTL ends while it
// runs, until ctx ends. Several processes may run it: the events' ids make their copies
// duplicates the stream drops.
func (s *Store) PublishExpiries(ctx context.Context) error {
	w, err := s.overrides.WatchAll(ctx)
	if err != nil {
		return unlessEnded(ctx, fmt.Errorf("watch overrides: %w", err))
	}
	defer w.Stop()
	known := map[string]rules.Override{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("overrides watcher stopped"))
			}
			if e == nil {
				continue
			}
			switch e.Operation() {
			case jetstream.KeyValuePut:
				var o rules.Override
				if json.Unmarshal(e.Value(), &o) == nil {
					known[e.Key()] = o
				}
			case jetstream.KeyValuePurge: // the TTL's marker; an admin's removal is a Delete
				o, ok := known[e.Key()]
				delete(known, e.Key())
				if !ok {
					continue
				}
				ev := OverrideEvent(events.OverrideExpired, "quotaflow", o.ExpiresAt, o)
				if err := events.Publish(ctx, s.js, ev.NATSSubject(), ev.ID, ev); err != nil {
					s.log.Warn("override expiry event not published", "override", o.ID, "err", err)
				}
			default:
				delete(known, e.Key())
			}
		}
	}
}

// unlessEnded is err, or nil once ctx ended: a watch ends with its context, and whatever
// failed then (a watcher's updates closed, which the select may see before ctx.Done; a watch
// refused because its context was canceled) is that end, not an error.
func unlessEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
