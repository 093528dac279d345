package publisher

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// replayItem is a message published by the replayer, awaiting its ack.
type replayItem struct {
	fut   jetstream.PubAckFuture
	count int64
	// first: a batch PublishDurable spooled (fragments closed by a marker), sent from the
	// spool for the first time, not a decision the direct path spooled when NATS could not
	// take it: acked, it counts as Published, not Replayed.
	first bool
}

// replayLoop publishes the spool whenever NATS is up and the spool is not empty. Appends to
// the spool and the stream becoming ready wake it; it also looks every 20ms (or
// FlushInterval if longer), for a connection that came back.
func (c *Client) replayLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(max(c.cfg.FlushInterval, 20*time.Millisecond))
	defer tick.Stop()
	backoff := time.NewTimer(0)
	<-backoff.C
	var st replayState
	for {
		select {
		case <-c.stop:
			return
		case <-c.replayCh:
		case <-tick.C:
		}
		wait := c.replay(&st)
		if wait == 0 {
			continue
		}
		backoff.Reset(wait)
		select {
		case <-c.stop:
			backoff.Stop()
			return
		case <-backoff.C:
		}
	}
}

// replay publishes the spool in rounds until it is empty, then switches to Direct mode; when
// a publish fails it returns how long to wait before trying again.
func (c *Client) replay(st *replayState) (retryAfter time.Duration) {
	for {
		if !c.nc.IsConnected() || !c.streamReady.Load() {
			return 0
		}
		select {
		case <-c.abort:
			return 0
		default:
		}
		atEnd, err := c.replayRound(st)
		if err != nil {
			return c.replayFailed(err)
		}
		if !atEnd {
			continue
		}
		// At the end of the spool. While the last round awaited its acks the batcher may have
		// appended more: publish those with modeMu held, so that it cannot append another, and
		// switch to Direct mode if they all make it. The batcher waits for one round trip.
		c.modeMu.Lock()
		switched := false
		if c.mode == modeSpooling && !c.aborted && c.inflight == 0 {
			atEnd, err = c.replayRound(st)
			if err == nil && atEnd && c.nc.IsConnected() && c.streamReady.Load() {
				c.setMode(modeDirect, "spool drained")
				switched = true
			}
		}
		direct := c.mode == modeDirect
		c.modeMu.Unlock()
		if err != nil {
			return c.replayFailed(err)
		}
		if direct {
			// PublishDurable's decisions go through the spool in Direct mode too: starting a
			// new segment (a file created, the folder fsynced) each time they are all
			// published would cost more than they do; a quarter segment of them is worth it.
			minBytes := c.cfg.SegmentBytes / 4
			if switched {
				minBytes = 0
			}
			if c.spool.compact(minBytes) {
				st.reset() // its position was in a segment that is gone
			}
			return 0
		}
		if !atEnd {
			continue
		}
		return 0
	}
}

// replayFailed logs a failed replay round and returns the time to wait before the next.
func (c *Client) replayFailed(err error) time.Duration {
	if err != errAborted {
		c.noteErr(err)
		c.log.Warn("replaying the spool failed, retrying", "err", err, "spool_bytes", c.spool.pendingBytes())
	}
	return 250 * time.Millisecond
}

// replayState is what the replayer carries from one round to the next: where it reads, and
// the batches of PublishDurable whose fragments it has read but whose marker it has not.
type replayState struct {
	items []replayItem
	valid bool     // pos and open follow the cursor; false: start over from the cursor
	pos   spoolPos // the next record to read
	open  []*openReplay
	byID  map[string]*openReplay
}

// openReplay is a batch being put together from its fragments.
type openReplay struct {
	partition int
	id        string
	count     int64
	data      []byte
	first     spoolPos // its first fragment: the cursor must not pass it before its ack
}

// reset makes the next round start over from the cursor.
func (st *replayState) reset() {
	st.valid = false
	clear(st.open)
	st.open = st.open[:0]
	clear(st.byID)
}

// safe returns how far the cursor may move once every message sent is acked: to the first
// fragment of the batches still open, or past everything read.
func (st *replayState) safe() spoolPos {
	if len(st.open) > 0 {
		return st.open[0].first
	}
	return st.pos
}

// replayRound publishes up to MaxPending messages from the spool, reading from where the last
// round stopped: each whole record as its own message, and the batches of fragments once a
// marker closes them. When every message of the round is acked it moves the cursor as far as
// it may (replayState.safe). atEnd says it read up to the end of the spool. After a failure
// the next round starts over from the cursor and publishes again under the same message ids:
// the stream drops those it already has.
func (c *Client) replayRound(st *replayState) (atEnd bool, failure error) {
	defer func() {
		clear(st.items)
		st.items = st.items[:0]
	}()
	if !st.valid {
		st.reset()
		st.pos, st.valid = c.spool.ackPos(), true
	}
	if st.byID == nil {
		st.byID = map[string]*openReplay{}
	}
	atEnd, skip, failure := c.replayRead(st)
	if err := c.replayAcks(st); failure == nil {
		failure = err
	}
	if failure != nil {
		st.reset()
		return false, failure
	}
	for _, it := range st.items {
		if it.first {
			c.published.Add(it.count)
		} else {
			c.replayed.Add(it.count)
		}
	}
	if skip {
		c.spool.skipSegment(st.pos)
		st.reset()
		return false, nil
	}
	c.spool.commit(st.safe())
	return atEnd, nil
}

// replayRead reads the spool from st.pos and sends what it reads, until the round has
// MaxPending messages in flight. atEnd: it read up to the end of the spool; skip: the record at
// st.pos is unreadable, and its segment is to be given up after the acks.
func (c *Client) replayRead(st *replayState) (atEnd, skip bool, failure error) {
	for len(st.items) < c.cfg.MaxPending {
		rec, ok, err := c.spool.read(st.pos)
		if err != nil {
			c.log.Error("unreadable spool record: skipping the rest of its segment", "err", err)
			return false, true, nil
		}
		if !ok {
			return true, false, nil
		}
		if err := c.replayRecord(st, &rec); err != nil {
			return false, false, err
		}
		st.pos = rec.end
	}
	return false, false, nil
}

// replayRecord sends a whole record as its own message, adds a fragment to its open batch, or,
// at a marker, sends every open batch.
func (c *Client) replayRecord(st *replayState, rec *spoolRecord) error {
	switch {
	case !rec.fragment:
		return c.replaySend(st, rec.partition, rec.id, rec.count, rec.data, false)
	case rec.marker():
		var err error
		for _, b := range st.open {
			if err = c.replaySend(st, b.partition, b.id, b.count, b.data, true); err != nil {
				break
			}
		}
		clear(st.open)
		st.open = st.open[:0]
		clear(st.byID)
		return err
	default:
		b := st.byID[rec.id]
		if b == nil {
			b = &openReplay{partition: rec.partition, id: rec.id, first: st.pos}
			st.open = append(st.open, b)
			st.byID[rec.id] = b
		}
		b.data = append(b.data, rec.data...)
		b.count += rec.count
		return nil
	}
}

// replaySend publishes one message of the round under its id, and adds it to the round's
// items to await.
func (c *Client) replaySend(st *replayState, partition int, id string, count int64, data []byte, first bool) error {
	fut, err := c.jsReplay.PublishMsgAsync(c.newMsg(partition, int(count), data), jetstream.WithMsgID(id))
	if errors.Is(err, nats.ErrMaxPayload) {
		// The server will never take it: drop it rather than block the spool.
		c.drop(count, "batch larger than the server's max payload")
		return nil
	}
	if err != nil {
		return err
	}
	st.items = append(st.items, replayItem{fut: fut, count: count, first: first})
	c.pending.Add(count)
	return nil
}

// replayAcks waits for the ack of every message of the round, even after one fails (each
// counted in pending until then), and returns the first failure.
func (c *Client) replayAcks(st *replayState) error {
	var failure error
	for _, it := range st.items {
		var err error
		select {
		case <-it.fut.Ok():
		case err = <-it.fut.Err():
		case <-c.abort:
			err = errAborted
		}
		c.pending.Add(-it.count)
		if err != nil && failure == nil {
			failure = err
		}
	}
	return failure
}

// ensureLoop creates or updates the stream until it succeeds, and again whenever a publish
// says the stream is missing.
func (c *Client) ensureLoop() {
	defer c.wg.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff, failures := minBackoff, 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.ensureCh:
		case <-timer.C:
		}
		if c.streamReady.Load() {
			continue
		}
		wait := 20 * time.Millisecond
		if c.nc.IsConnected() {
			ctx, cancel := context.WithTimeout(c.ctx, c.cfg.AckTimeout)
			_, err := EnsureStream(ctx, c.js, c.cfg)
			cancel()
			if err == nil {
				c.streamReady.Store(true)
				backoff, failures = minBackoff, 0
				c.kick(c.replayCh)
				continue
			}
			if c.ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 || failures%30 == 0 {
				c.log.Warn("cannot ensure the stream yet: spooling", "err", err, "attempts", failures)
			}
			wait = backoff
			backoff = min(2*backoff, maxBackoff)
		}
		timer.Reset(wait)
	}
}

// maintainLoop spools the overflow batches, hands the spool's buffered writes to the OS and
// closes PublishDurable's open batches every FlushInterval, saves the
// spool's cursor every 100ms and logs dropped decisions at most once a second.
func (c *Client) maintainLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.FlushInterval)
	defer tick.Stop()
	cursorEvery := max(int(100*time.Millisecond/c.cfg.FlushInterval), 1)
	var lastCursorErr time.Time
	for n := 1; ; n++ {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		c.spoolOverflows()
		c.spool.flush()
		c.closeBatches()
		if n%cursorEvery == 0 {
			if err := c.spool.saveCursor(false); err != nil && time.Since(lastCursorErr) > 10*time.Second {
				lastCursorErr = time.Now()
				c.log.Warn("cannot save the spool cursor: a restart would replay published batches again", "err", err)
			}
		}
		c.logDrops(false)
	}
}

// logDrops logs the dropped decisions counted since the last log, at most once a second
// unless forced.
func (c *Client) logDrops(force bool) {
	n := c.dropped.Load()
	if n == c.dropLogged || (!force && time.Since(c.dropLoggedAt) < time.Second) {
		return
	}
	why := ""
	if p := c.dropWhy.Load(); p != nil {
		why = *p
	}
	c.log.Error("decisions dropped", "dropped_total", n, "dropped_since_last_log", n-c.dropLogged,
		"reason", why, "spool_dir", c.cfg.SpoolDir, "spool_max_bytes", c.cfg.SpoolMaxBytes)
	c.dropLogged, c.dropLoggedAt = n, time.Now()
}
