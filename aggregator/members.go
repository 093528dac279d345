package aggregator

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// membershipLoop heartbeats into the members bucket and, from the live members, decides which
// partitions this process consumes: rendezvous hashing gives each partition to one member,
// and moves only the partitions of members that come or go.
func (a *Aggregator) membershipLoop(ctx context.Context, kv jetstream.KeyValue) error {
	tick := time.NewTicker(a.cfg.Heartbeat)
	defer tick.Stop()
	for {
		// One beat's requests end with the beat: a request in flight when its NATS server dies is
		// never answered, and a listing whose server stops delivering never ends.
		bctx, cancel := context.WithTimeout(ctx, 2*a.cfg.Heartbeat)
		if _, err := kv.Put(bctx, a.cfg.InstanceID, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			if ctx.Err() != nil {
				cancel()
				return ctx.Err()
			}
			a.log.Warn("heartbeat failed; keeping the current partitions", "err", err)
		} else if members, err := liveMembers(bctx, kv); err != nil {
			if ctx.Err() != nil {
				cancel()
				return ctx.Err()
			}
			a.log.Warn("list aggregators failed; keeping the current partitions", "err", err)
		} else {
			a.leader.Store(leads(members, a.cfg.InstanceID))
			a.reconcile(ctx, assign(members, a.cfg.InstanceID, a.cfg.Partitions))
		}
		cancel()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func liveMembers(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, err
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		// The lister stops at ctx's end without saying so: the list may be partial, and a
		// partial list would hand out the partitions of members that are alive.
		return nil, fmt.Errorf("list members: %w", err)
	}
	return keys, nil
}

// assign returns the partitions self owns among members (self is always counted): the
// members sorted by name take the partitions round-robin, so the split is even and every
// member computes the same one from the same list.
func assign(members []string, self string, partitions int) []int {
	if !slices.Contains(members, self) {
		members = append(members, self)
	}
	members = slices.Clone(members)
	slices.Sort(members)
	i := slices.Index(members, self)
	var mine []int
	for p := i; p < partitions; p += len(members) {
		mine = append(mine, p)
	}
	return mine
}

// leads reports whether self is the first live member by name: the one that acts for all
// (the policies' overrides).
func leads(members []string, self string) bool {
	for _, m := range members {
		if m < self {
			return false
		}
	}
	return true
}

// Leader reports whether this aggregator is, as of its last heartbeat, the first live member
// by name, which writes the policies' overrides. Two may both believe it for a heartbeat after
// a change of members; the policies' deterministic override ids make that harmless.
func (a *Aggregator) Leader() bool { return a.leader.Load() }

// reconcile starts consuming the partitions newly assigned and releases the others.
func (a *Aggregator) reconcile(ctx context.Context, want []int) {
	a.mu.Lock()
	var drop []*partition
	for p, pt := range a.owned {
		if !slices.Contains(want, p) {
			drop = append(drop, pt)
			delete(a.owned, p)
		}
	}
	var added []int
	for _, p := range want {
		if _, ok := a.owned[p]; !ok {
			pctx, cancel := context.WithCancel(ctx)
			pt := &partition{p: p, cancel: cancel, done: make(chan struct{})}
			a.owned[p] = pt
			added = append(added, p)
			go a.fetchLoop(pctx, pt)
		}
	}
	a.mu.Unlock()
	if len(added) > 0 {
		a.log.Info("consuming partitions", "partitions", added)
	}
	if len(drop) == 0 {
		return
	}
	var released []int
	for _, pt := range drop {
		pt.cancel()
		<-pt.done
		released = append(released, pt.p)
	}
	// What the dropped partitions' fetchers handed over is inserted and acked before the pin
	// is given up; if that cannot happen soon (ClickHouse down), the pin times out instead.
	fctx, cancel := context.WithTimeout(ctx, a.cfg.InsertTimeout)
	defer cancel()
	if err := a.flushNow(fctx); err != nil {
		a.log.Warn("released partitions without unpinning; their pin will time out", "partitions", released, "err", err)
		return
	}
	for _, p := range released {
		a.unpin(ctx, p)
	}
	a.log.Info("released partitions", "partitions", released)
}

// releaseAll stops every fetcher and returns the partitions that were owned.
func (a *Aggregator) releaseAll() []int {
	a.mu.Lock()
	owned := a.owned
	a.owned = map[int]*partition{}
	a.mu.Unlock()
	var ps []int
	for p, pt := range owned {
		pt.cancel()
		<-pt.done
		ps = append(ps, p)
	}
	return ps
}

func (a *Aggregator) unpin(ctx context.Context, p int) {
	ctx, cancel := apiContext(ctx)
	defer cancel()
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	if err == nil {
		err = s.UnpinConsumer(ctx, ConsumerName(p), PriorityGroup)
	}
	if err != nil {
		a.log.Debug("unpin failed; the pin will time out", "partition", p, "err", err)
	}
}

var keyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func validKey(s string) bool { return keyRE.MatchString(s) }

// apiTimeout bounds one JetStream API request of a long-running loop: a request in flight when
// its NATS server dies is never answered, and nats.go would wait for ctx, which such loops run
// without a deadline.
const apiTimeout = 5 * time.Second

// apiContext is ctx bounded by apiTimeout.
func apiContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, apiTimeout)
}
