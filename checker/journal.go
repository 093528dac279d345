package checker

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// The balance journal (bucket.JournalEntry) makes a burn reach the grant ledger even when its
// decision is lost between Redis and the spool: a check, settle or recorded usage that burns a
// balance gets its decision id before its store call, and the script journals what it did under
// that id. Once the decision is durable (DurableSink.PublishDurable reports it), the entry is
// dropped (asynchronously, in batches: the trimmer); one that stays past Config.JournalGrace
// belongs to a decision that may never come (the checker was killed, or the answer lost), and
// the sweeper publishes it as a decision of its own, Outcome.Recovered, under the same id. The
// ledger counts each decision's moves once, so that a decision both published by its checker
// and recovered counts once (docs/entitlements.md).

// journalStore is the store's journal, where it has one (bucket.Store).
type journalStore interface {
	TrimJournal(ctx context.Context, refs []bucket.JournalRef) error
	OldJournal(ctx context.Context, age time.Duration, fn func([]bucket.JournalEntry) error) error
	ClaimSweep(ctx context.Context, owner string, every time.Duration, now time.Time) (bool, error)
}

var _ journalStore = (*bucket.Store)(nil)

const (
	// DefaultJournalGrace is Config.JournalGrace's default: far longer than a decision takes
	// to become durable (a spool write, milliseconds), so that a live checker's entries are
	// almost never recovered, and short enough that the ledger of a killed one is whole a
	// minute or two later.
	DefaultJournalGrace = time.Minute
	// trimBatch bounds the entries one trim pipeline deletes, and trimQueue those waiting: past
	// it an entry is left to the sweeper (published twice, counted once) rather than making a
	// check wait.
	trimBatch = 256
	trimQueue = 16 * trimBatch
)

// journal drops the engine's journal entries once their decisions are durable, and recovers
// the entries left, as long as the engine runs; Engine.Close stops it.
type journal struct {
	e     *Engine
	store journalStore
	grace time.Duration
	log   *slog.Logger
	trims chan bucket.JournalRef
	// ctx ends with close: it stops both loops (the trimmer once it dropped what was queued).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newJournal(e *Engine, store journalStore, grace time.Duration) *journal {
	j := &journal{e: e, store: store, grace: grace, log: e.log.With("part", "journal"),
		trims: make(chan bucket.JournalRef, trimQueue)}
	j.ctx, j.cancel = context.WithCancel(context.Background())
	j.wg.Add(2)
	go j.trimLoop()
	go j.sweepLoop()
	return j
}

// close stops the loops, once the entries queued were dropped (or a trim failed).
func (j *journal) close() {
	j.cancel()
	j.wg.Wait()
}

// journalArg is the journal argument of a charge of sub's balance reported by decision id.
func journalArg(id string, sub Subject) string {
	return bucket.JournalArg(id, sub.Dimension.String()+":"+sub.ID)
}

// durable drops the entries of out, a decision made durable: its journaled balances'.
func (j *journal) durable(out *Outcome) {
	for i := range out.Limits {
		if l := out.Limits[i].Limit; l != nil && l.Journal != "" {
			j.drop(bucket.JournalRef{Key: l.Key, ID: out.ID})
		}
	}
}

// drop queues an entry for deletion; with the queue full it is left to the sweeper.
func (j *journal) drop(r bucket.JournalRef) {
	select {
	case j.trims <- r:
	default:
	}
}

// trimLoop deletes the queued entries, as many at once as are waiting; once the journal is
// closed, those still queued, so that a checker stopped in order leaves none to recover.
func (j *journal) trimLoop() {
	defer j.wg.Done()
	batch := make([]bucket.JournalRef, 0, trimBatch)
	for {
		select {
		case <-j.ctx.Done():
			if len(j.trims) == 0 {
				return
			}
		case r := <-j.trims:
			batch = append(batch, r)
		}
		for len(batch) < trimBatch && len(j.trims) > 0 {
			batch = append(batch, <-j.trims)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := j.store.TrimJournal(ctx, batch)
		cancel()
		if err != nil {
			j.log.Debug("journal entries not dropped: the sweeper publishes them again, and the ledger counts them once", "entries", len(batch), "err", err)
			if j.ctx.Err() != nil {
				return
			}
		}
		batch = batch[:0]
	}
}

// sweepLoop sweeps once per grace, when this checker is the one to.
func (j *journal) sweepLoop() {
	defer j.wg.Done()
	t := time.NewTicker(j.grace)
	defer t.Stop()
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-t.C:
		}
		n, err := j.sweep(j.ctx)
		switch {
		case err != nil && j.ctx.Err() == nil:
			j.log.Warn("journal sweep failed; the next one tries again", "err", err)
		case n > 0:
			j.log.Info("recovered balance moves whose decisions were lost", "decisions", n)
		}
	}
}

// sweep publishes the entries older than the grace as recovered decisions, once the claim of
// this round is this checker's, and drops those made durable. It returns how many it published.
func (j *journal) sweep(ctx context.Context) (int, error) {
	ok, err := j.store.ClaimSweep(ctx, j.e.instanceID, j.grace, time.Now())
	if err != nil || !ok {
		return 0, err
	}
	n := 0
	err = j.store.OldJournal(ctx, j.grace, func(page []bucket.JournalEntry) error {
		var done []bucket.JournalRef
		for i := range page {
			q, out := j.e.recovered(&page[i])
			if j.e.publish(ctx, q, out) {
				done = append(done, page[i].JournalRef)
				n++
			}
		}
		return j.store.TrimJournal(ctx, done)
	})
	return n, err
}

// recovered is the decision of a journal entry whose own may be lost: an event that decides
// nothing and reports the balance's moves and the thresholds its charge told, under the lost
// decision's id (the ledger and the entitlement events count one id once).
func (e *Engine) recovered(en *bucket.JournalEntry) (*Query, *Outcome) {
	head, entID, _ := strings.Cut(en.Key, ":bl:")
	sub := holderSubject(en.Holder, head)
	q := &Query{Endpoint: "/", Entitlement: entID}
	if sub.Dimension.Valid() && sub.Dimension != rules.DimensionOrg {
		q.Subjects = []Subject{sub}
	}
	out := &Outcome{Allowed: true, Now: en.At, ID: en.ID, Decider: -1, Recovered: true}
	rule := &rules.Rule{ID: entID, Algorithm: algorithm.Balance}
	if set := e.rules.Load(); set != nil {
		if ent, ok := set.Entitlement(entID); ok {
			rule = ent.Rule()
		}
	}
	// Limit 0: what the balance had is unknown here, and no warning state reads it.
	lim := &Limit{Key: en.Key, Algorithm: algorithm.Balance,
		Periods: calendar.Span{Start: en.PeriodStart, First: en.PeriodEnd.Sub(en.PeriodStart)}}
	res := LimitResult{Allowed: true, ResetAt: en.PeriodEnd, Balance: &bucket.BalanceChange{Told: en.Told, Moves: en.Moves}}
	out.Limits = []LimitOutcome{{Rule: rule, Subject: sub, Limit: lim, Result: res}}
	return q, out
}

// holderSubject is the subject a journal entry's holder names ("<dimension>:<id>"), or for a
// settle's (none) the one its balance's key names.
func holderSubject(holder, keyHead string) Subject {
	if dim, id, ok := strings.Cut(holder, ":"); ok {
		if d, err := rules.ParseDimension(dim); err == nil {
			return Subject{Dimension: d, ID: id}
		}
	}
	sub := tagSubject(keyTag(keyHead))
	if id, err := url.PathUnescape(sub.ID); err == nil {
		sub.ID = id
	}
	return sub
}
