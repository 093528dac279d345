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

	w := newWatchState(s, apply)
	defer w.expiry.Stop()
	// A watch created while its NATS server dies may never deliver the end of its initial
	// values; the caller restarts a watch that returns.
	initial := time.NewTimer(initialValuesTimeout)
	defer initial.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-initial.C:
			if !w.configReady || !w.overridesReady {
				return fmt.Errorf("watch: the initial values did not all arrive within %v", initialValuesTimeout)
			}
		case <-w.expiry.C:
			w.rebuild()
		case e, ok := <-cw.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("config watcher stopped"))
			}
			w.configEntry(e)
		case e, ok := <-ow.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("overrides watcher stopped"))
			}
			w.overrideEntry(e)
		}
	}
}

// watchState is what a Watch has read of the buckets, from which it compiles the set it applies.
type watchState struct {
	s     *Store
	apply func(*rules.Set)

	doc       *rules.Document
	gen       string                              // of doc's users
	users     map[string]map[string]rules.DocUser // by generation, then id
	overrides map[string]rules.Override
	// configReady and overridesReady say that a bucket's initial values are all read: until
	// both are, a set would lack some of the store's content.
	configReady, overridesReady bool
	expiry                      *time.Timer // at the next override's expiry
}

func newWatchState(s *Store, apply func(*rules.Set)) *watchState {
	w := &watchState{s: s, apply: apply, users: map[string]map[string]rules.DocUser{},
		overrides: map[string]rules.Override{}, expiry: time.NewTimer(time.Hour)}
	w.expiry.Stop()
	return w
}

// rebuild compiles and applies the set once both buckets' initial values are read, and sets
// the expiry timer to the next override's end.
func (w *watchState) rebuild() {
	if !w.configReady || !w.overridesReady || w.doc == nil {
		return
	}
	set, err := w.doc.CompileWithUsers(w.users[w.gen])
	if err != nil {
		w.s.log.Error("stored configuration does not compile; keeping the last good one", "err", err)
		return
	}
	ovs := make([]rules.Override, 0, len(w.overrides))
	for _, o := range w.overrides {
		ovs = append(ovs, o)
	}
	set = set.WithOverrides(ovs)
	if next := set.NextExpiry(w.s.now()); !next.IsZero() {
		w.expiry.Reset(time.Until(next))
	}
	w.apply(set)
}

// configEntry takes a change of the config bucket (nil: the end of its initial values).
func (w *watchState) configEntry(e jetstream.KeyValueEntry) {
	if e == nil {
		w.configReady = true
		w.rebuild()
		return
	}
	if e.Key() == rulesetKey {
		if e.Operation() != jetstream.KeyValuePut {
			return // the document is replaced, never removed
		}
		d, g, err := decodeDoc(e.Value())
		if err != nil {
			w.s.log.Error("stored rules unreadable; keeping the last good ones", "err", err)
			return
		}
		w.doc, w.gen = d, g
	} else if g, id, ok := parseUserKey(e.Key()); ok {
		// Users of another generation are kept for the document that will name them
		// (an Apply writes them first), and change nothing enforced yet.
		if !w.s.watchUser(w.users, g, id, e) || g != w.gen {
			return
		}
	} else {
		return
	}
	if w.configReady {
		w.rebuild()
	}
}

// overrideEntry takes a change of the overrides bucket (nil: the end of its initial values).
func (w *watchState) overrideEntry(e jetstream.KeyValueEntry) {
	if e == nil {
		w.overridesReady = true
		w.rebuild()
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(w.overrides, e.Key())
	} else {
		var o rules.Override
		if err := json.Unmarshal(e.Value(), &o); err != nil {
			w.s.log.Error("stored override unreadable; skipped", "override", e.Key(), "err", err)
			return
		}
		w.overrides[e.Key()] = o
	}
	if w.overridesReady {
		w.rebuild()
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
