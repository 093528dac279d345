// Package webhook delivers the events of a JetStream stream to HTTP endpoints as webhooks,
// signed as the Standard Webhooks specification says (https://www.standardwebhooks.com/):
// a POST of the event's JSON with the headers webhook-id, webhook-timestamp and
// webhook-signature (Sign, Verify).
//
// The contract:
//
//   - At least once. A message is acknowledged in its endpoint's durable consumer only after
//     a 2xx answer, a failure for good (a 4xx other than 408, 409, 425, 429) or the end of its
//     retry schedule (a day, DefaultSchedule); a crash, a Close or a lost ack in between
//     delivers it again. Receivers must deduplicate.
//   - The same id. webhook-id is the message's Nats-Msg-Id, else "<stream>-<sequence>": the
//     same on every attempt and to every endpoint. webhook-timestamp and the signature are
//     each attempt's own, since receivers refuse old timestamps.
//   - No order. An endpoint's messages are attempted one at a time in stream order, but a
//     failed one is retried later, after messages that came behind it: receivers must order
//     events by their content, not by arrival.
//   - Endpoints are independent. Each has its own durable consumer (ConsumerName) and loop,
//     and every attempt is bounded (Config.Timeout): a dead or slow receiver delays its own
//     messages only, and nothing of the stream's publishers. Several dispatchers may share
//     the consumers, each message going to one of them.
//   - JSON as published. The body is the message's data as it is, sent as
//     application/json; a message that is not JSON is logged as failed, not sent. Its type
//     (for Endpoint.Filter) is its TypeHeader, else its subject.
//   - Hostile endpoints are refused. Endpoint.Validate names the field at fault, and the
//     URLPolicy is enforced again at every connection (DNS rebinding).
//
// Every attempt is recorded in a delivery Log.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/field"
)

// TypeHeader is the NATS header that holds a message's event type (Message.Type); without
// it, the type is the message's subject.
const TypeHeader = "Quotaflow-Event-Type"

// Config says where a Dispatcher reads events and how it delivers them. The zero value is
// usable but for Stream; withDefaults holds the defaults.
type Config struct {
	// Stream is the JetStream stream of the events. Required. Its MaxAge must exceed the
	// retry schedule's Span: a message the stream drops is retried no more.
	Stream string
	// Subjects filter the stream's subjects (wildcards allowed); all of them when empty.
	Subjects []string
	// Policy is where endpoints may point: SetEndpoints checks them with it, and every
	// connection is checked again.
	Policy URLPolicy
	// Timeout bounds one attempt (DefaultTimeout).
	Timeout time.Duration
	// Schedule is when failed deliveries are retried (DefaultSchedule).
	Schedule Schedule
	// MaxAckPending bounds an endpoint's messages in flight or waiting for their retry
	// (1000): past it, a dead endpoint's new messages wait in the stream, not in the
	// server's memory.
	MaxAckPending int
	// Log records every attempt (none when nil); LogTimeout bounds one Record (5s).
	Log        Log
	LogTimeout time.Duration
	// Logger receives the logs, with "component"="webhook"; discarded when nil.
	Logger *slog.Logger
}

// ackMargin is what the consumers' AckWait adds to an attempt's timeout and its log record:
// the time to build the message and acknowledge it, so that a message is redelivered only
// when its dispatcher is gone, never while it is still being tried.
const ackMargin = 30 * time.Second

// withDefaults is c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Schedule.Span == 0 && c.Schedule.Delays == nil && c.Schedule.Every == 0 {
		c.Schedule = DefaultSchedule
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	if c.Log == nil {
		c.Log = nopLog{}
	}
	if c.LogTimeout == 0 {
		c.LogTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = c.Logger.With("component", "webhook")
	return c
}

// validate reports the first field of c that is not usable, as a *field.Error.
func (c Config) validate() error {
	switch {
	case c.Stream == "":
		return field.Errorf("stream", "required")
	case c.Timeout < 0:
		return field.Errorf("timeout", "%v: must not be negative", c.Timeout)
	case c.LogTimeout < 0:
		return field.Errorf("log_timeout", "%v: must not be negative", c.LogTimeout)
	case c.MaxAckPending < 1:
		return field.Errorf("max_ack_pending", "%d: want at least 1", c.MaxAckPending)
	}
	if err := c.Schedule.validate(); err != nil {
		return field.Wrap("schedule", err)
	}
	return nil
}

// nopLog is the Log of a Config without one.
type nopLog struct{}

func (nopLog) Record(context.Context, string, string, Attempt) error { return nil }

// ErrClosed is returned by the methods of a closed Dispatcher.
var ErrClosed = errors.New("webhook dispatcher closed")

// Dispatcher delivers a stream's events to a set of endpoints, each in a loop of its own
// (SetEndpoints), until Close.
type Dispatcher struct {
	js     jetstream.JetStream
	cfg    Config
	sender *Sender

	mu      sync.Mutex
	workers map[string]*worker // by endpoint id; the enabled endpoints only
	closed  bool
}

// New returns a Dispatcher of the events of cfg.Stream over js, with no endpoints yet.
func New(js jetstream.JetStream, cfg Config) (*Dispatcher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("webhook config: %w", err)
	}
	return &Dispatcher{
		js:      js,
		cfg:     cfg,
		sender:  NewSender(cfg.Policy, cfg.Timeout),
		workers: map[string]*worker{},
	}, nil
}

// SetEndpoints makes eps the endpoints delivered to. It checks them all first (without DNS:
// the connections are checked instead) and changes nothing when one fails, returning a
// *field.Error that names it ("endpoints[2].url"). Then a new or re-enabled endpoint's loop
// starts, its consumer taking the events published from now on (or, when it exists already,
// from where it stopped); a changed endpoint's next attempt uses its new URL, secret and
// filter; a removed or disabled one's loop stops, its consumer left on the server (Forget
// deletes it).
func (d *Dispatcher) SetEndpoints(eps []Endpoint) error {
	want, err := d.check(eps)
	if err != nil {
		return err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrClosed
	}
	var stop []*worker
	for id, w := range d.workers {
		if _, ok := want[id]; !ok {
			stop = append(stop, w)
			delete(d.workers, id)
		}
	}
	for id, ep := range want {
		if w, ok := d.workers[id]; ok {
			w.ep.Store(&ep)
		} else {
			d.workers[id] = d.start(ep)
		}
	}
	d.mu.Unlock()
	for _, w := range stop {
		w.stop()
	}
	return nil
}

// check validates eps and returns the enabled ones by id.
func (d *Dispatcher) check(eps []Endpoint) (map[string]Endpoint, error) {
	want := make(map[string]Endpoint, len(eps))
	seen := make(map[string]int, len(eps))
	for i, ep := range eps {
		where := fmt.Sprintf("endpoints[%d]", i)
		if err := ep.validate(d.cfg.Policy, false); err != nil {
			return nil, within(where, err)
		}
		if j, ok := seen[ep.ID]; ok {
			return nil, field.Errorf(where+".id", "%q is endpoints[%d]'s already", ep.ID, j)
		}
		seen[ep.ID] = i
		if !ep.Disabled {
			ep.Filter = append([]string(nil), ep.Filter...) // the caller's slice may change
			want[ep.ID] = ep
		}
	}
	return want, nil
}

// Forget deletes the consumer of an endpoint deleted for good, and with it the endpoint's
// pending retries. The endpoint must not be among the current ones.
func (d *Dispatcher) Forget(ctx context.Context, id string) error {
	d.mu.Lock()
	_, running := d.workers[id]
	d.mu.Unlock()
	if running {
		return field.Errorf("id", "%q is a current endpoint: remove it first", id)
	}
	if err := checkID(id); err != nil {
		return field.Wrap("id", err)
	}
	err := d.js.DeleteConsumer(ctx, d.cfg.Stream, ConsumerName(id))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("forget webhook endpoint %s: %w", id, err)
	}
	return nil
}

// Close stops every endpoint's loop and waits for them. An attempt in flight is cut short and
// its message handed back to the stream, to be delivered again (with the same id) by the next
// dispatcher; a finished attempt's log record is let finish, within Config.LogTimeout. Close
// is idempotent.
func (d *Dispatcher) Close() {
	d.mu.Lock()
	d.closed = true
	workers := d.workers
	d.workers = map[string]*worker{}
	d.mu.Unlock()
	for _, w := range workers {
		w.cancel()
	}
	for _, w := range workers {
		<-w.done
	}
}
