package rulestore

import (
	"context"
	"errors"
	"fmt"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/retry"
)

// ErrNotReachable is a Follower's answer to reads and writes while the store has not been
// opened yet (NATS down when the checker started).
var ErrNotReachable = errors.New("the rule store is not reachable yet (NATS down at start); the checker enforces its rules file meanwhile")

// ErrReadOnly is a read-only Follower's answer to writes.
var ErrReadOnly = errors.New("this checker may only read the rule store: its NATS credentials are the checker role's; give it the admin role's as well (--nats-admin-creds) to write")

// FollowerConfig configures a Follower. The zero value follows an existing store.
type FollowerConfig struct {
	// Store configures the store the Follower opens.
	Store Config
	// ReadOnly follows a store it may not write (its NATS credentials are the checker role's,
	// package natsauth): it binds the buckets rather than creating them, never seeds, and
	// refuses writes with ErrReadOnly.
	ReadOnly bool
	// Seed, when set, is written to the store when it holds no rules yet (the --rules file);
	// SeedPath names it in logs. A read-only Follower ignores it.
	Seed     *rules.Document
	SeedPath string
	// OpenTimeout bounds each attempt to open the store (5s).
	OpenTimeout time.Duration
	// Logger receives the follower's and the store's logs, with "component"="rulestore"
	// (discarded when nil).
	Logger *slog.Logger
}

// Follower keeps a checker's rules in step with the store: it opens the store (seeding it when
// empty), retries with backoff while NATS is unreachable, and watches every change. It also
// serves the admin API's reads and writes, which fail with ErrNotReachable until the store is
// open. Its methods are safe for concurrent use.
type Follower struct {
	js    jetstream.JetStream
	cfg   FollowerConfig
	log   *slog.Logger
	store atomic.Pointer[Store]
}

// NewFollower returns a Follower of the store in js; it does not contact NATS.
func NewFollower(js jetstream.JetStream, cfg FollowerConfig) *Follower {
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "rulestore")
	if cfg.Store.Logger == nil {
		cfg.Store.Logger = log
	}
	if cfg.ReadOnly {
		cfg.Store.Bind, cfg.Seed = true, nil
	}
	return &Follower{js: js, cfg: cfg, log: log}
}

// Open opens the store within the open timeout, seeds it when it holds no rules yet, and
// returns its configuration. An empty store without a seed is rules.ErrNotSeeded.
func (f *Follower) Open(ctx context.Context) (*rules.Set, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.OpenTimeout)
	defer cancel()
	store, err := Open(ctx, f.js, f.cfg.Store)
	if err != nil {
		return nil, err
	}
	if f.cfg.Seed != nil {
		seeded, err := store.Seed(ctx, f.cfg.Seed)
		if err != nil {
			return nil, fmt.Errorf("seed the rule store: %w", err)
		}
		if seeded {
			f.log.Info("rule store seeded from the rules file", "rules", f.cfg.SeedPath)
		} else {
			f.log.Info("rule store already holds rules: they win over the rules file (quotaflow rules apply -f replaces them)", "rules", f.cfg.SeedPath)
		}
	}
	set, err := store.Current(ctx)
	if err != nil {
		return nil, err
	}
	f.store.Store(store)
	return set, nil
}

// Run hands every change of the store's configuration to apply until ctx ends. When the store
// is not open yet (Open failed at start) it first retries opening it, with a backoff of 250ms
// doubling to 10s, the rules file enforced meanwhile; a watch that stops is restarted a second
// later.
func (f *Follower) Run(ctx context.Context, apply func(*rules.Set)) error {
	b := retry.Backoff{Min: 250 * time.Millisecond, Max: 10 * time.Second}
	for ctx.Err() == nil {
		store := f.store.Load()
		if store == nil {
			set, err := f.Open(ctx)
			if err != nil {
				wait := b.Next()
				if ctx.Err() == nil {
					f.log.Warn("rule store still unreachable; enforcing the rules file", "err", err, "retry_in", wait)
				}
				retry.Sleep(ctx, wait)
				continue
			}
			apply(set)
			f.log.Info("rule store reachable: enforcing its rules from now on", "rule_count", len(set.Rules()))
			store = f.store.Load()
		}
		err := store.Watch(ctx, apply)
		if ctx.Err() != nil {
			return nil
		}
		f.log.Warn("rule store watch stopped; restarting it", "err", err)
		retry.Sleep(ctx, time.Second)
	}
	return nil
}

// with runs op on the store, or fails with ErrNotReachable before it is open.
func (f *Follower) with(op func(*Store) error) error {
	s := f.store.Load()
	if s == nil {
		return ErrNotReachable
	}
	return op(s)
}

// write runs op, a write, on the store: with, refused with ErrReadOnly by a read-only Follower.
func (f *Follower) write(op func(*Store) error) error {
	if f.cfg.ReadOnly {
		return ErrReadOnly
	}
	return f.with(op)
}

// Current is Store.Current.
func (f *Follower) Current(ctx context.Context) (set *rules.Set, err error) {
	err = f.with(func(s *Store) error { set, err = s.Current(ctx); return err })
	return set, err
}

// Apply is Store.Apply.
func (f *Follower) Apply(ctx context.Context, doc *rules.Document, actor string, opts rules.ApplyOptions) (changes rules.Changes, err error) {
	err = f.write(func(s *Store) error { changes, err = s.Apply(ctx, doc, actor, opts); return err })
	return changes, err
}

// PutRule is Store.PutRule.
func (f *Follower) PutRule(ctx context.Context, r rules.DocRule, actor string) (created bool, err error) {
	err = f.write(func(s *Store) error { created, err = s.PutRule(ctx, r, actor); return err })
	return created, err
}

// CreateRule is Store.CreateRule.
func (f *Follower) CreateRule(ctx context.Context, r rules.DocRule, actor string) error {
	return f.write(func(s *Store) error { return s.CreateRule(ctx, r, actor) })
}

// DeleteRule is Store.DeleteRule.
func (f *Follower) DeleteRule(ctx context.Context, id, actor string) error {
	return f.write(func(s *Store) error { return s.DeleteRule(ctx, id, actor) })
}

// PutExemption is Store.PutExemption.
func (f *Follower) PutExemption(ctx context.Context, e rules.DocExemption, actor string) (created bool, err error) {
	err = f.write(func(s *Store) error { created, err = s.PutExemption(ctx, e, actor); return err })
	return created, err
}

// DeleteExemption is Store.DeleteExemption.
func (f *Follower) DeleteExemption(ctx context.Context, id, actor string) error {
	return f.write(func(s *Store) error { return s.DeleteExemption(ctx, id, actor) })
}

// SetUserTier is Store.SetUserTier.
func (f *Follower) SetUserTier(ctx context.Context, user, tier, actor string) error {
	return f.write(func(s *Store) error { return s.SetUserTier(ctx, user, tier, actor) })
}

// SetUserZone is Store.SetUserZone.
func (f *Follower) SetUserZone(ctx context.Context, user, timezone string, anchorDay int, actor string) error {
	return f.write(func(s *Store) error { return s.SetUserZone(ctx, user, timezone, anchorDay, actor) })
}

// SetUserOrg is Store.SetUserOrg.
func (f *Follower) SetUserOrg(ctx context.Context, user, org, actor string) error {
	return f.write(func(s *Store) error { return s.SetUserOrg(ctx, user, org, actor) })
}

// PutOverride is Store.PutOverride.
func (f *Follower) PutOverride(ctx context.Context, o rules.Override) error {
	return f.write(func(s *Store) error { return s.PutOverride(ctx, o) })
}

// RenewOverride is Store.RenewOverride.
func (f *Follower) RenewOverride(ctx context.Context, id string, expires time.Time, actor string) error {
	return f.write(func(s *Store) error { return s.RenewOverride(ctx, id, expires, actor) })
}

// DeleteOverride is Store.DeleteOverride.
func (f *Follower) DeleteOverride(ctx context.Context, id, actor string) error {
	return f.write(func(s *Store) error { return s.DeleteOverride(ctx, id, actor) })
}

// Overrides is Store.Overrides.
func (f *Follower) Overrides(ctx context.Context) (ovs []rules.Override, err error) {
	err = f.with(func(s *Store) error { ovs, err = s.Overrides(ctx); return err })
	return ovs, err
}

// RecordGrant is Store.RecordGrant.
func (f *Follower) RecordGrant(ctx context.Context, action, actor string, d events.GrantDetail) error {
	return f.write(func(s *Store) error { return s.RecordGrant(ctx, action, actor, d) })
}
