package aggregator

import (
	"context"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// pinHeader carries the id of the pinned client on every message of a pinned consumer.
const pinHeader = "Nats-Pin-Id"

// partition is one partition being consumed by this process.
type partition struct {
	p      int
	cancel context.CancelFunc
	done   chan struct{}
}

// item is one stream message handed from a fetcher to the writer.
type item struct {
	p         int
	seq       uint64
	pin       string
	msg       jetstream.Msg
	decisions []*quotaflowv1.Decision
	// commits is Aggregator.commits read before the lookup that found the message not
	// stored: the writer's inserts after that number may hold it all the same.
	commits uint64
}

// fetchLoop pulls one partition's consumer in its priority group (only the pinned client
// receives messages), drops the messages ClickHouse already holds, acking them, and hands the
// others to the writer.
func (a *Aggregator) fetchLoop(ctx context.Context, pt *partition) {
	defer close(pt.done)
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	cons, ok := a.partitionConsumer(ctx, pt.p, &b)
	if !ok {
		return
	}
	// The partition's warning states are this goroutine's alone: decisions and timers take
	// turns, so no lock is needed.
	w := a.startWarnings(ctx, pt, cons)
	if w == nil {
		return
	}
	wait := min(time.Second, a.cfg.PinnedTTL/4)
	var items []item
	caughtUp := false
	for ctx.Err() == nil {
		// Timers fire only when the partition is caught up (the last fetch was not full), not
		// ahead of a backlog of earlier decisions.
		if caughtUp && !a.tickWarnings(ctx, w) {
			return
		}
		var fetched int
		var err error
		items, fetched, err = a.fetch(cons, pt.p, wait, items[:0])
		if err != nil {
			a.log.Debug("fetch failed", "partition", pt.p, "err", err)
			if !retry.Sleep(ctx, b.Next()) {
				return
			}
			continue
		}
		b = retry.Backoff{Max: a.cfg.MaxBackoff}
		caughtUp = fetched < a.cfg.FetchBatch
		if len(items) > 0 && !a.handOn(ctx, pt, w, items) {
			return
		}
	}
}

// partitionConsumer looks partition p's consumer up, retrying with b until ctx ends; ok is
// false when it ended.
func (a *Aggregator) partitionConsumer(ctx context.Context, p int, b *retry.Backoff) (cons jetstream.Consumer, ok bool) {
	for {
		cctx, cancel := apiContext(ctx)
		cons, err := a.js.Consumer(cctx, a.cfg.Stream, ConsumerName(p))
		cancel()
		if err == nil {
			return cons, true
		}
		if !retry.Sleep(ctx, b.Next()) {
			return nil, false
		}
	}
}

// fetch pulls up to FetchBatch messages of partition p, waiting at most wait for them, and
// appends the decodable ones to items; fetched counts them all.
func (a *Aggregator) fetch(cons jetstream.Consumer, p int, wait time.Duration, items []item) (_ []item, fetched int, _ error) {
	batch, err := cons.Fetch(a.cfg.FetchBatch, jetstream.FetchMaxWait(wait), jetstream.FetchPriorityGroup(PriorityGroup))
	if err != nil {
		return items, 0, err
	}
	for msg := range batch.Messages() {
		fetched++
		it, err := decode(p, msg)
		if err != nil {
			// A message that is not a DecisionBatch can never be stored: terminate it so it
			// does not block the partition, and say so loudly.
			a.log.Error("undecodable stream message terminated", "partition", p, "err", err)
			msg.Term()
			continue
		}
		items = append(items, it)
	}
	return items, fetched, nil
}

// handOn applies a fetched batch to the partition's warning states and hands the messages
// ClickHouse does not hold yet to the writer, acking the others. It reports false when the
// fetcher must stop: ctx ended, or the partition was released.
func (a *Aggregator) handOn(ctx context.Context, pt *partition, w *warnings, items []item) bool {
	// Read before the lookup: an insert committed after this read may be missing from
	// its answer, and the writer checks those inserts itself (see pending.recent).
	commits := a.commits.Load()
	for i := range items {
		items[i].commits = commits
	}
	stored, ok := a.lookupStored(ctx, pt.p, items)
	if !ok {
		return false // cancelled: the messages are redelivered to whoever owns the partition
	}
	// Warning states first: the transitions are published and the states saved before the
	// writer may ack the messages, so a message acked is a message applied.
	w.m.th = thresholdsOf(a.rules())
	for _, it := range items {
		if !stored[it.seq] {
			w.m.apply(it.seq, it.decisions)
		}
	}
	if a.saveWarnings(ctx, w) != nil {
		return false // released while NATS failed: the messages go to the next owner, unacked
	}
	for _, it := range items {
		if stored[it.seq] {
			a.skipped.Add(int64(len(it.decisions)))
			a.m.skipped.Add(context.Background(), int64(len(it.decisions)))
			it.msg.Ack()
			continue
		}
		select {
		case a.items <- it:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// lookupStored returns which of the items' stream sequences ClickHouse already holds,
// retrying while it cannot tell; false when ctx ended first.
func (a *Aggregator) lookupStored(ctx context.Context, p int, items []item) (map[uint64]bool, bool) {
	lo, hi := items[0].seq, items[0].seq
	for _, it := range items {
		lo, hi = min(lo, it.seq), max(hi, it.seq)
	}
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		stored, err := a.storedSeqs(ctx, p, lo, hi)
		if err == nil {
			return stored, true
		}
		if ctx.Err() != nil {
			return nil, false // stopping: the lookup was cut short, ClickHouse did not fail
		}
		a.clickhouseErrors.Add(1)
		a.m.clickhouseErrors.Add(context.Background(), 1)
		wait := b.Next()
		a.log.Warn("look up stored messages failed; retrying", "partition", p, "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return nil, false
		}
	}
}

// storedSeqs returns the stream sequences of partition p in [lo, hi] that are stored.
func (a *Aggregator) storedSeqs(ctx context.Context, p int, lo, hi uint64) (map[uint64]bool, error) {
	q := fmt.Sprintf("SELECT DISTINCT stream_seq FROM %s.ingested_messages WHERE partition = %d AND stream_seq >= %d AND stream_seq <= %d", a.cfg.Database, p, lo, hi)
	stored, err := a.seqs(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("look up stored messages of partition %d: %w", p, err)
	}
	return stored, nil
}

// storedDecisions returns the stream sequences of pp's messages (partition p) whose decisions
// the decisions table holds, read within the batch's span of decision times so that ClickHouse
// reads only the parts of that span. Only a recheck after a failed insert asks: the table's
// order (tier, subject, time) makes it a scan of those parts, where ingested_messages is a
// lookup by its key.
func (a *Aggregator) storedDecisions(ctx context.Context, p int, pp *partPending) (map[uint64]bool, error) {
	from, to := pp.first/1e6, pp.last/1e6+1 // whole seconds around the span
	q := fmt.Sprintf("SELECT DISTINCT stream_seq FROM %s.decisions WHERE partition = %d AND stream_seq >= %d AND stream_seq <= %d AND time >= toDateTime(%d) AND time <= toDateTime(%d)",
		a.cfg.Database, p, pp.lo, pp.hi, from, to)
	stored, err := a.seqs(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("look up stored decisions of partition %d: %w", p, err)
	}
	return stored, nil
}

// seqs runs q, a query of one column of stream sequences, within the insert timeout.
func (a *Aggregator) seqs(ctx context.Context, q string) (map[uint64]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.InsertTimeout)
	defer cancel()
	rows, err := a.ch.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	seqs := map[uint64]bool{}
	for rows.Next() {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		seqs[seq] = true
	}
	return seqs, rows.Err()
}

func decode(p int, msg jetstream.Msg) (item, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return item{}, fmt.Errorf("message metadata: %w", err)
	}
	var batch quotaflowv1.DecisionBatch
	if err := proto.Unmarshal(msg.Data(), &batch); err != nil {
		return item{}, fmt.Errorf("stream sequence %d: decode decision batch: %w", meta.Sequence.Stream, err)
	}
	return item{p: p, seq: meta.Sequence.Stream, pin: msg.Headers().Get(pinHeader), msg: msg, decisions: batch.Decisions}, nil
}
