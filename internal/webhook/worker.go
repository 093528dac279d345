package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/retry"
)

// fetchWait is how long one pull waits for a message: long, since a cancelled context (Close)
// ends it at once anyway.
const fetchWait = 30 * time.Second

// worker is one endpoint's loop: it pulls the endpoint's consumer one message at a time and
// delivers each.
type worker struct {
	d  *Dispatcher
	id string
	// ep is the endpoint as last set: SetEndpoints swaps it while the loop runs.
	ep atomic.Pointer[Endpoint]
	// since is when the endpoint was set (or registered: Endpoint.Since): a consumer created
	// for it starts there, so that the events published after that reach it, however late
	// the consumer is created (NATS down at the time, the registration learned late).
	since  time.Time
	cancel context.CancelFunc
	done   chan struct{}
}

// startSlack moves a new consumer's start back, for the NATS server's clock being behind
// ours: an event published just after SetEndpoints must not be stamped before its start. An
// endpoint may get an event of the second before it was set; it misses none after.
const startSlack = time.Second

// start starts ep's loop.
func (d *Dispatcher) start(ep Endpoint) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	since := time.Now()
	if !ep.Since.IsZero() && ep.Since.Before(since) {
		since = ep.Since
	}
	w := &worker{d: d, id: ep.ID, since: since.Add(-startSlack), cancel: cancel, done: make(chan struct{})}
	w.ep.Store(&ep)
	go w.run(ctx)
	return w
}

// stop ends the loop and waits for it.
func (w *worker) stop() {
	w.cancel()
	<-w.done
}

// run delivers until ctx ends, starting again (a second later) after NATS failed it.
func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	log := w.d.cfg.Logger.With("endpoint", w.id)
	retry.Forever(ctx, log, "webhook delivery", w.consume)
}

// consume delivers the consumer's messages one at a time until ctx ends or NATS fails.
func (w *worker) consume(ctx context.Context) error {
	cons, err := w.consumer(ctx)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, fetchWait)
		msg, err := cons.Next(jetstream.FetchContext(fctx))
		cancel()
		switch {
		case ctx.Err() != nil:
		case err == nil:
			w.handle(ctx, msg)
		case !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded):
			return err
		}
	}
	return nil
}

// consumer creates the endpoint's durable consumer, or updates it to the dispatcher's
// configuration (subjects, ack wait, pending bound) keeping its place in the stream.
func (w *worker) consumer(ctx context.Context) (jetstream.Consumer, error) {
	c := w.d.cfg
	cfg := jetstream.ConsumerConfig{
		Durable:        ConsumerName(w.id),
		Description:    "quotaflow webhook deliveries to endpoint " + w.id,
		FilterSubjects: c.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.Timeout + c.LogTimeout + ackMargin,
		MaxDeliver:     -1, // the Schedule ends the retries: its Span, not a count
		MaxAckPending:  c.MaxAckPending,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &w.since,
	}
	if old, err := w.d.js.Consumer(ctx, c.Stream, cfg.Durable); err == nil {
		cfg.DeliverPolicy, cfg.OptStartTime = old.CachedInfo().Config.DeliverPolicy, old.CachedInfo().Config.OptStartTime
		cfg.OptStartSeq = old.CachedInfo().Config.OptStartSeq
		return w.d.js.UpdateConsumer(ctx, c.Stream, cfg)
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, err
	}
	return w.d.js.CreateConsumer(ctx, c.Stream, cfg)
}

// handle delivers msg to the endpoint once, records the attempt and acknowledges msg, or
// hands it back for its next attempt.
func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	ep := *w.ep.Load()
	m, n, err := w.d.message(msg)
	if err != nil { // not a JetStream message: nothing to deliver, nothing to redeliver
		w.d.cfg.Logger.Error("webhook message without metadata", "endpoint", ep.ID, "err", err)
		w.settle(msg, Attempt{}, m.ID)
		return
	}
	if !ep.wants(m.Type) {
		w.settle(msg, Attempt{}, m.ID)
		return
	}
	a := Attempt{At: time.Now(), Err: "body is not JSON: not sent"}
	if json.Valid(m.Body) {
		a = w.d.sender.Send(ctx, ep, m)
	}
	if ctx.Err() != nil && !a.Delivered() { // cut short: whoever runs next tries again
		_ = msg.Nak()
		return
	}
	a.N = n
	w.schedule(&a)
	w.record(ep.ID, m.ID, a)
	w.settle(msg, a, m.ID)
}

// message is msg as a Message, and the number of its attempt (its deliveries).
func (d *Dispatcher) message(msg jetstream.Msg) (Message, int, error) {
	md, err := msg.Metadata()
	if err != nil {
		return Message{}, 0, err
	}
	m := Message{ID: msg.Headers().Get(jetstream.MsgIDHeader), Type: msg.Headers().Get(TypeHeader), At: md.Timestamp, Body: msg.Data()}
	if m.ID == "" || !token(m.ID) || len(m.ID) > maxIDHeader {
		m.ID = md.Stream + "-" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	if m.Type == "" {
		m.Type = msg.Subject()
	}
	return m, int(min(md.NumDelivered, 1<<30)), nil
}

// maxIDHeader bounds a Nats-Msg-Id used as the webhook-id: a longer one is no id a receiver
// expects to store, and "<stream>-<sequence>" stands in, as unique and as stable.
const maxIDHeader = 256

// schedule sets a's Next, or GaveUp, when a failed but may mend.
func (w *worker) schedule(a *Attempt) {
	if a.Delivered() || !a.Retry {
		return
	}
	wait, ok := w.d.cfg.Schedule.Next(a.N)
	if !ok {
		a.GaveUp = true
		return
	}
	a.Next = max(wait, a.RetryAfter)
}

// record appends a to the delivery log, and logs what needs an operator's eye.
func (w *worker) record(endpoint, id string, a Attempt) {
	log := w.d.cfg.Logger.With("endpoint", endpoint, "id", id, "attempt", a.N, "status", a.Status, "err", a.Err)
	switch a.Outcome() {
	case "failed", "gave up":
		log.Warn("webhook delivery " + a.Outcome())
	case "retry":
		log.Debug("webhook delivery to retry", "next", a.Next)
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.d.cfg.LogTimeout)
	defer cancel()
	if err := w.d.cfg.Log.Record(ctx, endpoint, id, a); err != nil {
		log.Warn("webhook delivery log", "record", err)
	}
}

// settle acknowledges msg, or hands it back to be redelivered after a.Next.
func (w *worker) settle(msg jetstream.Msg, a Attempt, id string) {
	var err error
	if a.Next > 0 {
		err = msg.NakWithDelay(a.Next)
	} else {
		err = msg.Ack()
	}
	if err != nil { // the message comes back after the ack wait: one more attempt, same id
		w.d.cfg.Logger.Warn("webhook delivery not settled", "endpoint", w.id, "id", id, "err", err)
	}
}
