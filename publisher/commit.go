package publisher

import (
	"context"
	"runtime"
	"sync/atomic"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The states of a round.
const (
	roundOpen    int32 = iota // taking decisions, or being written
	roundWritten              // in the spool file
	roundFailed               // not written: its decisions are dropped
	roundExpired              // not written within SpoolWait: its checks were answered anyway
)

// round is a group commit: the decisions handed to PublishDurable while the writer wrote the
// previous round, written to the spool together in one write(2) and waited for together.
type round struct {
	batches []batch // per partition, in arrival order; a full batch is followed by a new one
	count   int
	state   atomic.Int32
	done    chan struct{} // closed when state leaves roundOpen
}

// finish moves the round from open to state and wakes its waiters; only the first call counts.
func (r *round) finish(state int32) {
	if r.state.CompareAndSwap(roundOpen, state) {
		close(r.done)
	}
}

// add encodes d into the round's open batch of partition p, starting one when there is none
// or it is full (MaxBatch decisions or maxBatchBytes: the batch is one NATS message).
func (r *round) add(c *Client, p int, d *quotaflowv1.Decision) error {
	var b *batch
	for i := len(r.batches) - 1; i >= 0; i-- {
		if r.batches[i].partition == p {
			if r.batches[i].count < c.cfg.MaxBatch && len(r.batches[i].buf) < maxBatchBytes {
				b = &r.batches[i]
			}
			break
		}
	}
	if b == nil {
		r.batches = append(r.batches, batch{partition: p, buf: c.getBuf()})
		b = &r.batches[len(r.batches)-1]
	}
	n := len(b.buf)
	buf, err := appendDecision(b.buf, d)
	if err != nil {
		b.buf = buf[:n]
		return err
	}
	b.buf = buf
	b.count++
	r.count++
	return nil
}

// PublishDurable renders out as Publish does and returns once the decision is in the spool
// file: written to the OS, so that a crash of the process cannot lose it (a crash of the OS
// or a power loss can: the spool is not fsynced per write). The checks that arrive while a
// round is written share the next round's single write. It returns earlier when ctx is done,
// or after SpoolWait, or when the write fails (spool full or disk full, the decision then
// dropped): the check is answered anyway and counted in Stats.Unspooled. With NoSpoolWait it
// is Publish. It implements checker.DurableSink.
//
// The spooled decisions reach NATS through the replayer, under the message ids they were
// spooled with: after a kill -9 the next client on the spool publishes them again from its
// cursor, and the stream drops the batches it already has.
func (c *Client) PublishDurable(ctx context.Context, checkerID string, q *checker.Query, out *checker.Outcome) bool {
	d := Decision(checkerID, q, out)
	if c.cfg.NoSpoolWait {
		c.PublishDecision(d)
		return true // as durable as this configuration makes decisions
	}
	r := c.commit(d)
	if r == nil {
		c.unspooled.Add(1)
		return false
	}
	select {
	case <-r.done:
		if r.state.Load() != roundWritten {
			c.unspooled.Add(1)
			return false
		}
		return true
	case <-ctx.Done():
		return false
	}
}

// PublishDurableAll is PublishDurable of the decisions outs[i] of qs[i], made by one
// CheckAll: they join the round being formed together, and the call waits once for each
// round they joined (one, or two when a write began between them) rather than once per
// decision. It implements checker.DurableSink.
func (c *Client) PublishDurableAll(ctx context.Context, checkerID string, qs []*checker.Query, outs []*checker.Outcome) bool {
	if c.cfg.NoSpoolWait {
		for i, out := range outs {
			c.PublishDecision(Decision(checkerID, qs[i], out))
		}
		return true
	}
	type joined struct {
		r *round
		n int64
	}
	var rounds []joined
	durable := true
	for i, out := range outs {
		r := c.commit(Decision(checkerID, qs[i], out))
		switch {
		case r == nil:
			c.unspooled.Add(1)
			durable = false
		case len(rounds) > 0 && rounds[len(rounds)-1].r == r:
			rounds[len(rounds)-1].n++
		default:
			rounds = append(rounds, joined{r, 1})
		}
	}
	for _, j := range rounds {
		select {
		case <-j.r.done:
			if j.r.state.Load() != roundWritten {
				c.unspooled.Add(j.n)
				durable = false
			}
		case <-ctx.Done():
			return false
		}
	}
	return durable
}

// commit adds d to the round being formed, starting it (and waking the writer) when there is
// none, and returns the round; nil when d is dropped: after Close, or when QueueSize decisions
// already wait for the writer (a disk slower than the checks: memory stays bounded).
func (c *Client) commit(d *quotaflowv1.Decision) *round {
	if c.closing.Load() {
		c.drop(1, "publish after close")
		return nil
	}
	if c.committing.Load() >= int64(c.cfg.QueueSize) {
		c.drop(1, "spool writes fall behind: queue full")
		return nil
	}
	p := stream.Partition(d.Subject, c.cfg.Partitions)
	c.commitMu.Lock()
	r := c.round
	first := r == nil
	if first {
		r = &round{done: make(chan struct{})}
		c.round = r
	}
	err := r.add(c, p, d)
	if err == nil {
		c.committing.Add(1)
	}
	c.commitMu.Unlock()
	if first {
		c.kick(c.commitCh)
	}
	if err != nil {
		c.drop(1, "cannot encode decision: "+err.Error())
		return nil
	}
	return r
}

// commitLoop is the writer: it writes each round as soon as its first decision wakes it. While
// it writes, the next round gathers the checks that arrive meanwhile, so a round holds more
// decisions the busier the checker is, and the writes per second stay bounded by how fast
// one write(2) is.
func (c *Client) commitLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.commitCh:
			// Let the goroutines that are ready run first: checks woken by the last write
			// decide their next check and join this round instead of the next one.
			runtime.Gosched()
			c.writeRound()
		case <-c.stop:
			return
		}
	}
}

// writeRound takes the round being formed and writes its batches to the spool in one write(2),
// each as a fragment of its partition's open batch (see batchOf), then wakes the round's
// waiters and the replayer.
func (c *Client) writeRound() {
	// Armed before writeMu: a marker's write may be the one that stalls.
	c.expiry.Reset(c.cfg.SpoolWait)
	defer c.expiry.Stop()
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.commitMu.Lock()
	r := c.round
	c.round = nil
	c.commitMu.Unlock()
	if r == nil {
		return
	}
	c.writing.Store(r)
	defer c.writing.Store(nil)
	recs := c.records[:0]
	for i := range r.batches {
		b := &r.batches[i]
		if b.count == 0 {
			continue
		}
		b.id = c.batchOf(b.partition, b.count, len(b.buf))
		recs = appendRecordHeader(recs, b.partition|fragmentFlag, b.id, b.count, b.buf)
		recs = append(recs, b.buf...)
		c.putBuf(b.buf)
	}
	err := c.spool.appendRound(recs)
	if cap(recs) <= 4<<20 {
		c.records = recs[:0]
	}
	n := int64(r.count)
	c.committing.Add(-n)
	if err != nil {
		c.drop(n, err.Error())
		r.finish(roundFailed)
		return
	}
	c.spooled.Add(n)
	c.writes.Add(1)
	r.finish(roundWritten)
	c.kick(c.replayCh)
}

// expire lets the checks of the round being written and of the round forming go: the writer
// has spent SpoolWait on this write. Checks that join the forming round afterwards go at once,
// until the writer takes it: the disk is slow, and that round's write re-arms the expiry.
func (c *Client) expire() {
	if r := c.writing.Load(); r != nil {
		r.finish(roundExpired)
	}
	c.commitMu.Lock()
	if c.round != nil {
		c.round.finish(roundExpired)
	}
	c.commitMu.Unlock()
}

// openBatch is the batch of a partition that the fragments of PublishDurable's rounds join
// until a marker closes it (closeBatches) or it is full.
type openBatch struct {
	id    string // message id; empty when the partition has no open batch
	count int
	size  int
}

// batchOf returns the message id of the batch that a fragment of count decisions and size
// bytes of partition p joins: the partition's open batch, or a new one when there is none or
// the fragment would take it past MaxBatch or maxBatchBytes. writeMu must be held.
//
// Messages are batches of a FlushInterval, as on the queue's path, not one per round and
// partition: a busy checker writes rounds of a few decisions spread over every partition, and
// NATS's cost is per message. The batch boundaries are in the spool itself (message ids and
// markers), so a client that replays the spool after a crash makes the same messages under
// the same ids, and the stream drops those it already has.
func (c *Client) batchOf(p, count, size int) string {
	o := &c.frags[p]
	if o.id == "" || o.count+count > c.cfg.MaxBatch || o.size+size > maxBatchBytes {
		if o.id == "" {
			c.fragsOpen++
		}
		*o = openBatch{id: c.msgID(p)}
	}
	o.count += count
	o.size += size
	return o.id
}

// closeBatches writes a marker to the spool, which makes every batch of the fragments before
// it whole for the replayer: every FlushInterval while batches are open, and on Close. When
// the marker cannot be written the batches stay open for the next one.
func (c *Client) closeBatches() {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.fragsOpen == 0 {
		return
	}
	if err := c.spool.mark(); err != nil {
		c.log.Warn("spool: cannot write a batch marker; retrying", "err", err)
		return
	}
	clear(c.frags)
	c.fragsOpen = 0
	c.kick(c.replayCh)
}
