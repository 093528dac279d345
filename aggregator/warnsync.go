package aggregator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The warning states of a partition live in the KV bucket <stream>_WARNINGS: one key per
// tracked (subject, rule), "p<partition>.<dimension>.k<id>.k<rule>" with id and rule in
// base64url (KV keys allow few characters), and "p<partition>.hw", the highest stream sequence
// applied. docs/warnings.md has the argument.

func (a *Aggregator) warningsBucket() string { return a.cfg.Stream + "_WARNINGS" }

func stateKey(p int, st *wstate) string {
	return "p" + strconv.Itoa(p) + "." + strconv.Itoa(int(st.Dim)) + ".k" +
		base64.RawURLEncoding.EncodeToString([]byte(st.ID)) + ".k" + base64.RawURLEncoding.EncodeToString([]byte(st.Rule))
}

func hwKey(p int) string { return "p" + strconv.Itoa(p) + ".hw" }

// warnings is a partition's state machine with what it needs to persist and publish.
type warnings struct {
	m      *machine
	p      int
	stored map[wkey]bool // the keys the bucket holds
}

// loadWarningsTimeout bounds loading a partition's states (and catching up), beyond the wait
// for a peer's pin.
const loadWarningsTimeout = 30 * time.Second

// startWarnings prepares a partition's states before its first fetch: it waits until no peer
// holds the partition's pin (a peer giving it up saves its states before it unpins), loads
// the states from the bucket, and applies the messages the consumer delivered beyond the saved
// high-water sequence (a dead owner's fetched, unsaved messages, which would otherwise come
// back only after the ack wait, behind newer ones). It returns nil when ctx ends first.
func (a *Aggregator) startWarnings(ctx context.Context, pt *partition, cons jetstream.Consumer) *warnings {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		// Bounded: a watch created while its NATS server dies may never deliver its end of
		// initial values, and the partition would then stay owned and never fetched.
		lctx, cancel := context.WithTimeout(ctx, a.cfg.PinnedTTL+2*a.cfg.Heartbeat+loadWarningsTimeout)
		w, err := a.loadWarnings(lctx, pt.p, cons)
		cancel()
		if err == nil {
			return w
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := b.Next()
		a.log.Warn("load warning states failed; retrying", "partition", pt.p, "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return nil
		}
	}
}

func (a *Aggregator) loadWarnings(ctx context.Context, p int, cons jetstream.Consumer) (*warnings, error) {
	// A pin held by a peer is released once the peer saved its states, or times out.
	deadline := time.Now().Add(a.cfg.PinnedTTL + 2*a.cfg.Heartbeat)
	var info *jetstream.ConsumerInfo
	for {
		var err error
		if info, err = cons.Info(ctx); err != nil {
			return nil, fmt.Errorf("consumer info: %w", err)
		}
		if pinned(info) == "" || time.Now().After(deadline) {
			break
		}
		if !retry.Sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	w := &warnings{m: newMachine(a.cfg.Stream), p: p, stored: map[wkey]bool{}}
	kw, err := a.warnKV.Watch(ctx, "p"+strconv.Itoa(p)+".>", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("watch warning states: %w", err)
	}
	defer kw.Stop()
	complete := false
	for e := range kw.Updates() {
		if e == nil {
			complete = true
			break
		}
		if e.Key() == hwKey(p) {
			if w.m.hw, err = strconv.ParseUint(string(e.Value()), 10, 64); err != nil {
				return nil, fmt.Errorf("warning high-water mark %q: %w", e.Value(), err)
			}
			continue
		}
		st := &wstate{}
		if err := json.Unmarshal(e.Value(), st); err != nil {
			a.log.Error("stored warning state unreadable; dropped", "key", e.Key(), "err", err)
			continue
		}
		w.m.states[st.key()] = st
		w.stored[st.key()] = true
	}
	if !complete {
		// The watch ended (its context did) before all the states came: a partial load would
		// forget subjects' states.
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("watch warning states: ended before the last state: %w", err)
		}
		return nil, errors.New("watch warning states: ended before the last state")
	}
	if delivered := info.Delivered.Stream; w.m.hw > 0 && delivered > w.m.hw {
		if err := a.catchUp(ctx, w, delivered); err != nil {
			return nil, err
		}
	}
	if len(w.m.states) > 0 || w.m.hw > 0 {
		a.log.Info("warning states loaded", "partition", p, "tracked", len(w.m.states), "applied_through", w.m.hw)
	}
	return w, nil
}

func pinned(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// catchUp applies the partition's messages after the high-water mark through seq, read
// directly from the stream, and saves the result.
func (a *Aggregator) catchUp(ctx context.Context, w *warnings, through uint64) error {
	oc, err := a.js.OrderedConsumer(ctx, a.cfg.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{stream.Subject(a.cfg.SubjectPrefix, w.p)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: w.m.hw + 1,
	})
	if err != nil {
		return fmt.Errorf("catch up warning states: %w", err)
	}
	w.m.th = thresholdsOf(a.rules())
	from := w.m.hw
	for done := false; !done; {
		batch, err := oc.Fetch(a.cfg.FetchBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("catch up warning states: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil || meta.Sequence.Stream > through {
				done = true
				continue
			}
			var b quotaflowv1.DecisionBatch
			if proto.Unmarshal(msg.Data(), &b) == nil {
				w.m.apply(meta.Sequence.Stream, b.Decisions)
			}
			done = done || meta.Sequence.Stream == through
		}
		done = done || n == 0 // the rest was removed from the stream
	}
	w.m.hw, w.m.hwDirty = max(w.m.hw, through), true
	a.log.Info("warning states caught up with a predecessor's unsaved messages", "partition", w.p, "from", from+1, "through", through)
	return a.saveWarnings(ctx, w)
}

// saveWarnings publishes the pending transitions and waits for the stream to keep them, then
// writes the changed states, then the high-water mark, then deletes the states that went back
// to normal: a crash at any point leaves a state from which the same decisions recompute the
// same transitions (whose copies the stream drops). It retries until it succeeds; it returns an
// error only when ctx ended first, and then the caller must not hand the messages on.
func (a *Aggregator) saveWarnings(ctx context.Context, w *warnings) error {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		err := a.saveOnce(ctx, w)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		wait := b.Next()
		a.log.Warn("saving warning states failed; holding the partition's messages and retrying", "partition", w.p, "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return err
		}
	}
}

func (a *Aggregator) saveOnce(ctx context.Context, w *warnings) error {
	// The partition's ctx may end mid-save (it is being released): finish within a bound so
	// that what was published is saved before the pin goes to a peer.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.InsertTimeout)
	defer cancel()
	// In chunks below the client's async publish window (4000 by default), which would
	// otherwise stall.
	for len(w.m.out) > 0 {
		n := min(len(w.m.out), 1000)
		if err := a.publishTransitions(ctx, w.m.out[:n]); err != nil {
			return err
		}
		clear(w.m.out[:n])
		w.m.out = w.m.out[n:]
	}
	w.m.out = nil
	for len(w.m.crossed) > 0 {
		n := min(len(w.m.crossed), 1000)
		if err := a.publishCrossings(ctx, w.m.crossed[:n]); err != nil {
			return err
		}
		clear(w.m.crossed[:n])
		w.m.crossed = w.m.crossed[n:]
	}
	w.m.crossed = nil
	var settled []*wstate
	for k, st := range w.m.states {
		if !st.dirty {
			continue
		}
		if w.m.settled(st) {
			settled = append(settled, st)
			if !w.stored[k] {
				continue // never saved: the high-water mark alone covers it
			}
		}
		data, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("encode warning state: %w", err)
		}
		if _, err := a.warnKV.Put(ctx, stateKey(w.p, st), data); err != nil {
			return fmt.Errorf("save warning state: %w", err)
		}
		w.stored[k], st.dirty = true, false
	}
	if w.m.hwDirty {
		if _, err := a.warnKV.Put(ctx, hwKey(w.p), []byte(strconv.FormatUint(w.m.hw, 10))); err != nil {
			return fmt.Errorf("save warning high-water mark: %w", err)
		}
		w.m.hwDirty = false
	}
	for _, st := range settled {
		k := st.key()
		if w.stored[k] {
			if err := a.warnKV.Delete(ctx, stateKey(w.p, st)); err != nil {
				return fmt.Errorf("delete warning state: %w", err)
			}
			delete(w.stored, k)
		}
		delete(w.m.states, k)
	}
	return nil
}

// publishTransitions sends the transitions to the events stream, each with its id as
// Nats-Msg-Id, and waits for the stream's acks. A copy the stream drops (the same transition
// recomputed after a crash or by a successor) is not counted again.
func (a *Aggregator) publishTransitions(ctx context.Context, ts []transition) error {
	futures := make([]jetstream.PubAckFuture, len(ts))
	for i := range ts {
		data, err := json.Marshal(&ts[i].ev)
		if err != nil {
			return fmt.Errorf("encode transition: %w", err)
		}
		msg := &nats.Msg{Subject: ts[i].ev.NATSSubject(), Data: data, Header: nats.Header{}}
		if futures[i], err = a.js.PublishMsgAsync(msg, jetstream.WithMsgID(ts[i].ev.ID)); err != nil {
			return fmt.Errorf("publish transition %s: %w", ts[i].ev.ID, err)
		}
	}
	var errs []error
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if !ack.Duplicate {
				a.transitions.Add(1)
				a.m.transitions.Add(context.Background(), 1, metric.WithAttributes(
					attribute.String("from", ts[i].ev.From), attribute.String("to", ts[i].ev.To)))
			}
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("publish transition %s: %w", ts[i].ev.ID, err))
		case <-ctx.Done():
			return fmt.Errorf("publish transitions: %w", ctx.Err())
		}
	}
	return errors.Join(errs...)
}

// tickWarnings runs the timers due a grace before the wall clock (recovery comes without
// traffic) and saves what they changed; false when the save failed because ctx ended.
func (a *Aggregator) tickWarnings(ctx context.Context, w *warnings) bool {
	w.m.th = thresholdsOf(a.rules())
	if !w.m.tick(time.Now().Add(-a.cfg.WarningGrace).UnixMicro()) {
		return true
	}
	return a.saveWarnings(ctx, w) == nil
}
