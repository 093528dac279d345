package publisher

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// errAborted fails the acks still awaited when Close's ctx is done.
var errAborted = errors.New("close deadline reached before the ack")

// maxBatchBytes ends a batch before MaxBatch decisions when its encoding reaches this size,
// well below NATS's default max payload (1 MiB) even with a large last decision.
const maxBatchBytes = 256 << 10

// batch is the encoded decisions of one partition: a DecisionBatch, built by appending each
// decision as a field-1 length-delimited record.
type batch struct {
	partition int
	count     int
	first     uint64 // batcher tick at which the first decision arrived
	id        string // Nats-Msg-Id, set when the batch is flushed
	buf       []byte
}

// watchItem is a direct publish awaiting its ack.
type watchItem struct {
	fut jetstream.PubAckFuture
	b   batch
}

// marshalOptions reuse the size proto.Size just computed.
var marshalOptions = proto.MarshalOptions{UseCachedSize: true}

// appendDecision appends d to buf as one element of DecisionBatch.decisions.
func appendDecision(buf []byte, d *quotaflowv1.Decision) ([]byte, error) {
	size := proto.Size(d)
	buf = protowire.AppendTag(buf, 1, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(size))
	n := len(buf)
	buf, err := marshalOptions.MarshalAppend(buf, d)
	if err != nil {
		return buf, err
	}
	if len(buf)-n != size {
		return buf, errors.New("decision changed while it was encoded")
	}
	return buf, nil
}

// batchLoop groups the queued decisions into batches per partition and dispatches a batch
// when it is full or its oldest decision is about FlushInterval old. It takes the queued
// decisions on a tick of a quarter of FlushInterval (at least 1ms: Go timers below 1ms fire
// late; at most 10ms) instead of waiting on the queue: a Publish then never has to wake it,
// which would cost a futex call per decision. On stopBatch it drains the queue, dispatches
// every partial batch and exits.
func (c *Client) batchLoop() {
	defer c.wg.Done()
	defer close(c.batchDone)
	period := min(max(c.cfg.FlushInterval/4, time.Millisecond), 10*time.Millisecond)
	ticks := uint64(max(c.cfg.FlushInterval/period, 1))
	tick := time.NewTicker(period)
	defer tick.Stop()
	open := make([]batch, c.cfg.Partitions)
	// now counts ticks. The decisions taken at tick now were queued after tick now-1: a batch
	// whose first decision was taken then is flushed at tick now-1+ticks, at most
	// FlushInterval after that decision was queued.
	var now uint64 = 1
	// drain takes what is queued now, not what keeps coming: the ages are checked each tick.
	drain := func() {
		for n := len(c.queue); n > 0; n-- {
			c.add(open, <-c.queue, now-1) // never blocks: batchLoop is the only receiver
		}
	}
	for {
		select {
		case <-tick.C:
			now++
			drain()
			for p := range open {
				if open[p].count > 0 && now-open[p].first >= ticks {
					c.flush(&open[p])
				}
			}
		case <-c.stopBatch:
			for len(c.queue) > 0 { // Publish calls that raced with Close may still add some
				drain()
			}
			for p := range open {
				if open[p].count > 0 {
					c.flush(&open[p])
				}
			}
			return
		}
	}
}

// add encodes d into its partition's batch, and flushes the batch when it is full.
func (c *Client) add(open []batch, d *quotaflowv1.Decision, now uint64) {
	p := stream.Partition(d.Subject, c.cfg.Partitions)
	b := &open[p]
	if b.buf == nil {
		b.buf = c.getBuf()
	}
	n := len(b.buf)
	var err error
	if b.buf, err = appendDecision(b.buf, d); err != nil {
		b.buf = b.buf[:n]
		c.drop(1, "cannot encode decision: "+err.Error())
		return
	}
	if b.count == 0 {
		b.partition, b.first = p, now
	}
	b.count++
	c.batched.Add(1)
	if b.count >= c.cfg.MaxBatch || len(b.buf) >= maxBatchBytes {
		c.flush(b)
	}
}

// flush gives the batch its message id and dispatches it; *b starts over empty.
func (c *Client) flush(b *batch) {
	out := *b
	*b = batch{}
	out.id = c.msgID(out.partition)
	c.dispatch(out)
	c.batched.Add(-int64(out.count))
}

// msgID returns the next message id of partition p: "<InstanceID>.<partition>.<sequence>".
func (c *Client) msgID(p int) string {
	seq := c.seqs[p].n.Add(1)
	var a [64]byte
	buf := append(a[:0], c.cfg.InstanceID...)
	buf = append(buf, '.')
	buf = strconv.AppendInt(buf, int64(p), 10)
	buf = append(buf, '.')
	buf = strconv.AppendUint(buf, seq, 10)
	return string(buf)
}

// subject returns the subject of partition p.
func (c *Client) subject(p int) string {
	if p >= 0 && p < len(c.subjects) {
		return c.subjects[p]
	}
	return stream.Subject(c.cfg.SubjectPrefix, p) // a spooled batch of another partition count
}

// newMsg returns the message of a batch; its Nats-Msg-Id is set with jetstream.WithMsgID.
func (c *Client) newMsg(partition, count int, data []byte) *nats.Msg {
	return &nats.Msg{
		Subject: c.subject(partition),
		Data:    data,
		Header:  nats.Header{stream.CountHeader: []string{strconv.Itoa(count)}},
	}
}

// dispatch sends b to JetStream in Direct mode, else appends it to the spool. It never
// appends while direct batches await acks: one of them may fail and be spooled, and it must
// be spooled first.
func (c *Client) dispatch(b batch) {
	c.modeMu.Lock()
	defer c.modeMu.Unlock()
	for c.mode == modeDirect && !c.aborted {
		if !c.streamReady.Load() || !c.nc.IsConnected() {
			c.setMode(modeSpooling, "nats not connected")
			break
		}
		if c.inflight >= c.cfg.MaxPending {
			c.cond.Wait()
			continue
		}
		fut, err := c.js.PublishMsgAsync(c.newMsg(b.partition, b.count, b.buf), jetstream.WithMsgID(b.id))
		if err != nil {
			// A connection that closed or started reconnecting since the check above, or
			// ErrTooManyStalledMsgs (which inflight <= MaxPending, the context's own bound,
			// rules out): spool the batch and stay in Spooling mode until the spool drains.
			c.noteErr(err)
			c.setMode(modeSpooling, "publish: "+err.Error())
			break
		}
		c.inflight++
		c.pending.Add(int64(b.count))
		c.watchCh <- watchItem{fut: fut, b: b} // never blocks: inflight <= MaxPending = cap
		return
	}
	for c.inflight > 0 {
		c.cond.Wait()
	}
	c.spoolBatch(b)
}

// watchLoop waits for the acks of direct publishes in the order they were sent: an ack
// counts the batch published, a failure or timeout spools it and switches to Spooling.
func (c *Client) watchLoop() {
	defer c.wg.Done()
	for {
		var it watchItem
		select {
		case it = <-c.watchCh:
		case <-c.stop:
			return
		}
		var err error
		select {
		case <-it.fut.Ok():
		case err = <-it.fut.Err():
		case <-c.abort:
			err = errAborted
		}
		n := int64(it.b.count)
		c.modeMu.Lock()
		if err == nil {
			c.published.Add(n)
			c.putBuf(it.b.buf)
		} else {
			c.noteErr(err)
			c.setMode(modeSpooling, "ack: "+err.Error())
			c.spoolBatch(it.b)
		}
		c.inflight--
		c.pending.Add(-n)
		c.cond.Broadcast()
		c.modeMu.Unlock()
	}
}

// setMode switches to m, logging why. modeMu must be held.
func (c *Client) setMode(m mode, why string) {
	if c.mode == m {
		return
	}
	c.mode = m
	if m == modeSpooling {
		c.log.Warn("publishing to the spool until NATS is back", "reason", why)
	} else {
		c.log.Info("publishing directly to NATS", "reason", why)
	}
}

// noteErr has the stream ensured again when err says it is missing.
func (c *Client) noteErr(err error) {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, nats.ErrNoResponders) {
		c.streamReady.Store(false)
		c.kick(c.ensureCh)
	}
}

// spoolBatch appends b to the spool, or drops it when the spool is full.
func (c *Client) spoolBatch(b batch) {
	if err := c.spool.append(b.partition, b.id, b.count, b.buf); err != nil {
		c.drop(int64(b.count), err.Error())
	} else {
		c.spooled.Add(int64(b.count))
		c.kick(c.replayCh)
	}
	c.putBuf(b.buf)
}

// overflowSlot is the batch of one partition's decisions that Publish found no room for in
// the queue, padded to its own cache lines.
type overflowSlot struct {
	mu sync.Mutex
	b  batch
	_  [64]byte
}

// spoolOne adds d to its partition's overflow batch: the queue is full. The batch goes to
// the spool when it is full, and every FlushInterval (as the spool's buffer is written to
// the OS): one record per batch, not per decision, so the replayer publishes batches too.
func (c *Client) spoolOne(d *quotaflowv1.Decision) {
	p := stream.Partition(d.Subject, c.cfg.Partitions)
	o := &c.overflow[p]
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.b.buf == nil {
		o.b.buf, o.b.partition = make([]byte, 0, 4<<10), p
	}
	n := len(o.b.buf)
	buf, err := appendDecision(o.b.buf, d)
	if err != nil {
		o.b.buf = buf[:n]
		c.drop(1, "cannot encode decision: "+err.Error())
		return
	}
	o.b.buf = buf
	o.b.count++
	c.overflowed.Add(1)
	if o.b.count >= c.cfg.MaxBatch || len(o.b.buf) >= maxBatchBytes {
		c.spoolOverflow(o)
	}
}

// spoolOverflow appends an overflow batch to the spool. o.mu must be held.
func (c *Client) spoolOverflow(o *overflowSlot) {
	n := o.b.count
	if n == 0 {
		return
	}
	if err := c.spool.append(o.b.partition, c.msgID(o.b.partition), n, o.b.buf); err != nil {
		c.drop(int64(n), err.Error())
	} else {
		c.spooled.Add(int64(n))
		c.kick(c.replayCh)
	}
	c.overflowed.Add(-int64(n))
	o.b.buf, o.b.count = o.b.buf[:0], 0
}

// spoolOverflows appends every partial overflow batch to the spool.
func (c *Client) spoolOverflows() {
	for p := range c.overflow {
		o := &c.overflow[p]
		o.mu.Lock()
		c.spoolOverflow(o)
		o.mu.Unlock()
	}
}

// getBuf returns an empty batch buffer.
func (c *Client) getBuf() []byte {
	select {
	case b := <-c.bufs:
		return b[:0]
	default:
		return make([]byte, 0, 16<<10)
	}
}

// putBuf keeps b for a later batch, unless enough are kept or it grew too big.
func (c *Client) putBuf(b []byte) {
	if cap(b) > 4<<20 {
		return
	}
	select {
	case c.bufs <- b:
	default:
	}
}
