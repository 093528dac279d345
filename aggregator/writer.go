package aggregator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/schema"
)

// pending is the batch the writer is filling: rows plus, per partition, the messages to ack
// once the rows are stored.
type pending struct {
	rows    columns
	started time.Time
	parts   map[int]*partPending
	// unsure is set when an insert attempt failed: the server may have committed it all the
	// same, so no attempt follows before a recheck has dropped what is stored.
	unsure bool
	// queryID is the id of the last insert attempt: after a failed one, the server may still
	// be running it, and a recheck must wait until it no longer is (insertGone).
	queryID string
	// recent holds, per partition, the sequences of the committed inserts that a fetcher's
	// lookup may not have seen. A message whose ack wait expires while its first copy waits
	// in a batch is redelivered and looked up again; if that lookup ran before the batch's
	// insert committed, it finds nothing, and without this the copy would be stored twice.
	recent map[int][]committed
}

// committed is what one committed insert stored of a partition.
type committed struct {
	commit uint64 // its number: Aggregator.commits once it committed
	seqs   map[uint64]bool
}

type partPending struct {
	msgs   []jetstream.Msg
	seqs   map[uint64]bool // in this batch: a message redelivered meanwhile is not added twice
	lo, hi uint64
	pin    string
	// first and last are the earliest and latest decision times in the batch (unix µs): the
	// span a recheck reads the decisions table in (storedDecisions).
	first, last int64
}

// flushRequest asks the writer to insert and ack what it holds now.
type flushRequest chan error

// writeLoop collects items into batches and inserts each when it is big or old enough. It
// retries a failed insert until it succeeds or ctx ends, holding its acks meanwhile; fetchers
// block on the full channel, so JetStream keeps the backlog. When ctx ends it flushes once
// more, within the insert timeout.
func (a *Aggregator) writeLoop(ctx context.Context) error {
	b := &pending{parts: map[int]*partPending{}, recent: map[int][]committed{}}
	tick := time.NewTicker(max(a.cfg.FlushInterval/4, 5*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case it := <-a.items:
			a.add(b, it)
			if b.rows.len() >= a.cfg.BatchRows {
				a.flush(ctx, b)
			}
		case <-tick.C:
			if len(b.parts) > 0 && time.Since(b.started) >= a.cfg.FlushInterval {
				a.flush(ctx, b)
			}
		case req := <-a.flushReqs:
			a.drain(b)
			req <- a.flush(ctx, b)
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.InsertTimeout)
			defer cancel()
			a.drain(b)
			if err := a.flushOnce(final, b); err != nil {
				a.log.Warn("final insert failed; the unacked decisions are redelivered", "err", err)
			}
			return nil
		}
	}
}

// drain adds the items already handed over, without waiting for more.
func (a *Aggregator) drain(b *pending) {
	for {
		select {
		case it := <-a.items:
			a.add(b, it)
		default:
			return
		}
	}
}

// flushNow has the writer insert and ack what it holds, and waits for it.
func (a *Aggregator) flushNow(ctx context.Context) error {
	req := make(flushRequest, 1)
	select {
	case a.flushReqs <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// add appends an item's decisions unless the batch already holds its message or an insert
// its fetcher's lookup did not see stored it; such a copy is only acked with the batch.
func (a *Aggregator) add(b *pending, it item) {
	b.forget(it.p, it.commits)
	pp := b.parts[it.p]
	if pp == nil {
		pp = &partPending{seqs: map[uint64]bool{}, lo: it.seq, hi: it.seq}
		if len(b.parts) == 0 {
			b.started = time.Now()
		}
		b.parts[it.p] = pp
	}
	pp.msgs = append(pp.msgs, it.msg) // acking a redelivered copy too is harmless
	if pp.seqs[it.seq] || b.storedSince(it.p, it.commits, it.seq) {
		// Not counted as skipped: that counts what the lookup found, as the tests expect.
		return
	}
	pp.seqs[it.seq] = true
	pp.lo, pp.hi, pp.pin = min(pp.lo, it.seq), max(pp.hi, it.seq), it.pin
	batchID := it.msg.Headers().Get(stream.MsgIDHeader)
	for _, d := range it.decisions {
		if pp.first == 0 || d.TimeUs < pp.first {
			pp.first = d.TimeUs
		}
		pp.last = max(pp.last, d.TimeUs)
		b.rows.add(d, it.p, it.seq, batchID)
	}
}

// flush inserts the batch, retrying with backoff until it is stored or ctx ends.
func (a *Aggregator) flush(ctx context.Context, b *pending) error {
	bo := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		err := a.flushOnce(ctx, b)
		if err == nil || ctx.Err() != nil {
			return err
		}
		wait := bo.Next()
		a.log.Warn("insert into clickhouse failed; holding the acks and retrying", "rows", b.rows.len(), "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// flushOnce makes one insert attempt and, when it succeeds, acks and resets the batch. After
// a failed attempt it first rechecks what is stored, and makes no attempt while it cannot.
func (a *Aggregator) flushOnce(ctx context.Context, b *pending) error {
	if b.unsure {
		// The failed attempt may have been stored all the same (a timeout after the server
		// committed), or may still be stored: the server goes on with an insert whose client
		// gave up, so the recheck waits for it to end first. Before 22.2 no deduplication
		// token drops a second copy, so only a successful recheck may let the same rows be
		// sent again.
		err := a.insertGone(ctx, b.queryID)
		if err == nil {
			err = a.recheck(ctx, b)
		}
		if err != nil {
			a.clickhouseErrors.Add(1)
			a.m.clickhouseErrors.Add(context.Background(), 1)
			return fmt.Errorf("recheck after a failed insert: %w", err)
		}
		b.unsure = false
	}
	if len(b.parts) == 0 {
		return nil
	}
	if b.rows.len() > 0 {
		start := time.Now()
		if err := a.insert(ctx, b); err != nil {
			b.unsure = true
			a.clickhouseErrors.Add(1)
			a.m.clickhouseErrors.Add(context.Background(), 1)
			return err
		}
		a.m.insertDuration.Record(context.Background(), time.Since(start).Seconds())
		a.inserts.Add(1)
		a.inserted.Add(int64(b.rows.len()))
		a.m.inserted.Add(context.Background(), int64(b.rows.len()))
	}
	// Stored, here or by an attempt that failed: a copy looked up before now is dropped.
	c := a.commits.Add(1)
	for p, pp := range b.parts {
		if len(pp.seqs) > 0 {
			b.recent[p] = append(b.recent[p], committed{commit: c, seqs: pp.seqs})
		}
	}
	for p, pp := range b.parts {
		// Acked without waiting for the server's confirmation: a lost ack only means a
		// redelivery, which the lookup in ingested_messages skips.
		for _, m := range pp.msgs {
			if err := m.Ack(); err != nil {
				a.log.Debug("ack failed; the message will be redelivered and skipped", "partition", p, "err", err)
				break
			}
		}
	}
	b.rows.reset()
	clear(b.parts)
	return nil
}

// insert sends the batch's rows as one INSERT.
func (a *Aggregator) insert(ctx context.Context, b *pending) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.InsertTimeout)
	defer cancel()
	b.queryID = queryID()
	opts := []clickhouse.QueryOption{clickhouse.WithQueryID(b.queryID)}
	if a.dialect.Modern {
		// Same token for the same rows: a retry the server already stored is dropped by it too.
		opts = append(opts, clickhouse.WithSettings(clickhouse.Settings{"insert_deduplication_token": b.token()}))
	}
	ctx = clickhouse.Context(ctx, opts...)
	batch, err := a.ch.PrepareBatch(ctx, "INSERT INTO "+a.cfg.Database+"."+a.layout().Storage(schema.Decisions)+" ("+columnList+")")
	if err != nil {
		return fmt.Errorf("prepare insert: %w", err)
	}
	if err := b.rows.appendTo(batch); err != nil {
		batch.Abort()
		return fmt.Errorf("append rows: %w", err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("insert %d decisions: %w", b.rows.len(), err)
	}
	return nil
}

// queryID draws an insert's query id: 64 random bits, so that no two attempts share one.
func queryID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return "qf-insert-" + hex.EncodeToString(b[:])
}

// insertGone waits, up to the insert timeout, until the server runs no query of id: an insert
// whose attempt failed on this side (a timeout while the server was still at it) may still
// commit, and a recheck before it does would find nothing and send the rows again. An error
// means it could not tell, or the insert still runs: the caller tries again later.
func (a *Aggregator) insertGone(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.InsertTimeout)
	defer cancel()
	for {
		var n uint64
		if err := a.ch.QueryRow(ctx, "SELECT count() FROM system.processes WHERE query_id = ?", id).Scan(&n); err != nil {
			return fmt.Errorf("look up the failed insert %s: %w", id, err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the failed insert %s still runs: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// storedSince reports whether an insert numbered above commits stored partition p's seq.
func (b *pending) storedSince(p int, commits, seq uint64) bool {
	for _, c := range b.recent[p] {
		if c.commit > commits && c.seqs[seq] {
			return true
		}
	}
	return false
}

// forget drops partition p's inserts numbered commits or below: a lookup that read commits
// saw them, and a partition's fetchers hand their items over in the order they read it (one
// fetcher at a time, each reading it anew before each lookup), so no later item needs them.
func (b *pending) forget(p int, commits uint64) {
	r := b.recent[p]
	n := 0
	for n < len(r) && r[n].commit <= commits {
		n++
	}
	if n == len(r) {
		delete(b.recent, p)
		return
	}
	b.recent[p] = r[n:]
}

// token names the batch's rows by partition and sequence range.
func (b *pending) token() string {
	s := "qf"
	for _, p := range slices.Sorted(maps.Keys(b.parts)) {
		pp := b.parts[p]
		s += fmt.Sprintf(":%d/%d-%d/%d", p, pp.lo, pp.hi, len(pp.seqs))
	}
	return s
}

// recheck drops from the batch the rows ClickHouse now holds (a failed attempt may have been
// stored all the same) and the partitions whose pin moved to a peer while inserts failed.
func (a *Aggregator) recheck(ctx context.Context, b *pending) error {
	var errs []error
	drop := map[int]map[uint64]bool{}
	for p, pp := range b.parts {
		if time.Since(b.started) > a.cfg.PinnedTTL/2 && !a.stillPinned(ctx, p, pp.pin) {
			a.log.Warn("partition moved to a peer while inserts failed; its rows are left to the peer", "partition", p)
			drop[p] = pp.seqs
			delete(b.parts, p)
			continue
		}
		stored, err := a.storedSeqs(ctx, p, pp.lo, pp.hi)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// An insert cut off by a server's death can leave its decisions committed and the
		// view that records its messages (ingested_messages_mv) not: the decisions table
		// itself says what is stored.
		rows, err := a.storedDecisions(ctx, p, pp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for seq := range rows {
			stored[seq] = true
		}
		drop[p] = stored
	}
	dropped := b.rows.filter(func(p int, seq uint64) bool { return !drop[p][seq] })
	if dropped > 0 {
		a.log.Info("dropped rows already stored or moved", "rows", dropped)
	}
	return errors.Join(errs...)
}

// stillPinned reports whether partition p's consumer is still pinned to pin.
func (a *Aggregator) stillPinned(ctx context.Context, p int, pin string) bool {
	ctx, cancel := apiContext(ctx)
	defer cancel()
	cons, err := a.js.Consumer(ctx, a.cfg.Stream, ConsumerName(p))
	if err != nil {
		return true // cannot tell: keep the rows, the insert will say
	}
	info := cons.CachedInfo()
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup {
			return g.PinnedClientID == pin
		}
	}
	return true
}
