package rulestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// WebhookBucket holds the webhook endpoints, one key each (their ids), with their signing
// secrets: apart from the configuration bucket, which every role reads, so that only the roles
// that write endpoints (admin) and deliver to them (aggregator) read the secrets (package
// natsauth).
const WebhookBucket = "QUOTAFLOW_WEBHOOKS"

// The configuration change actions of webhook endpoints (events.ConfigEvent), whose detail is
// the endpoint without its secret.
const (
	ConfigWebhookSet     = "webhook_set"
	ConfigWebhookDeleted = "webhook_deleted"
)

// Webhooks reads and writes the webhook endpoints. It is safe for concurrent use. Its bucket is
// opened by the first call that needs it, so that a process starts whether or not NATS
// answers yet (a checker serves checks first); a call while NATS does not answer fails.
type Webhooks struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu sync.Mutex
	kv jetstream.KeyValue // nil until opened
}

// NewWebhooks returns the endpoints' store on js, its bucket created (with cfg.Replicas
// replicas) by the first call that needs it, or with cfg.Bind only opened: the aggregator's,
// which follows the endpoints the admin API's process sets (WatchEndpoints waits for the
// bucket, quietly: until it exists, there are none).
func NewWebhooks(js jetstream.JetStream, cfg Config) *Webhooks {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Webhooks{js: js, cfg: cfg, log: log, now: time.Now}
}

// OpenWebhooks is NewWebhooks with its bucket opened now, retrying while the NATS servers
// cannot yet until ctx ends (broker.Ensure).
func OpenWebhooks(ctx context.Context, js jetstream.JetStream, cfg Config) (*Webhooks, error) {
	w := NewWebhooks(js, cfg)
	err := broker.Ensure(ctx, w.log, "rule store: webhooks bucket", broker.EnsureConfig{Replicas: max(1, cfg.Replicas)}, func(ctx context.Context) error {
		_, err := w.bucket(ctx)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("%w (not created yet: the admin API's process creates it)", nats.ErrTimeout)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// bucket returns the endpoints' bucket, opening (or creating) it the first time:
// jetstream.ErrBucketNotFound for one bound that does not exist yet.
func (w *Webhooks) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kv != nil {
		return w.kv, nil
	}
	var kv jetstream.KeyValue
	var err error
	if w.cfg.Bind {
		kv, err = w.js.KeyValue(ctx, WebhookBucket)
	} else {
		kv, err = w.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: WebhookBucket, Description: "quotaflow webhook endpoints and their signing secrets", History: 5, Replicas: max(1, w.cfg.Replicas),
		})
	}
	if err != nil {
		return nil, fmt.Errorf("webhook endpoints' bucket: %w", err)
	}
	w.kv = kv
	return kv, nil
}

// Endpoints returns the endpoints, ordered by id.
func (w *Webhooks) Endpoints(ctx context.Context) ([]webhook.Endpoint, error) {
	kv, err := w.bucket(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	var out []webhook.Endpoint
	for k := range lister.Keys() {
		ep, _, err := w.Endpoint(ctx, k)
		if errors.Is(err, rules.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b webhook.Endpoint) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Endpoint returns endpoint id and its revision; rules.ErrNotFound when there is none.
func (w *Webhooks) Endpoint(ctx context.Context, id string) (webhook.Endpoint, uint64, error) {
	kv, err := w.bucket(ctx)
	if err != nil {
		return webhook.Endpoint{}, 0, err
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return webhook.Endpoint{}, 0, fmt.Errorf("webhook endpoint %q: %w", id, rules.ErrNotFound)
	}
	if err != nil {
		return webhook.Endpoint{}, 0, fmt.Errorf("read webhook endpoint %q: %w", id, err)
	}
	var ep webhook.Endpoint
	if err := json.Unmarshal(e.Value(), &ep); err != nil {
		return webhook.Endpoint{}, 0, fmt.Errorf("webhook endpoint %q: %w", id, err)
	}
	return ep, e.Revision(), nil
}

// PutEndpoint creates or replaces ep (validated by the caller: webhook.Endpoint.Validate),
// recording the change by actor as a config event without the secret. It reports whether the
// endpoint is new.
func (w *Webhooks) PutEndpoint(ctx context.Context, ep webhook.Endpoint, actor string) (created bool, err error) {
	data, err := json.Marshal(ep)
	if err != nil {
		return false, fmt.Errorf("encode webhook endpoint %q: %w", ep.ID, err)
	}
	_, rev, err := w.Endpoint(ctx, ep.ID)
	switch {
	case errors.Is(err, rules.ErrNotFound):
		rev, err = w.kv.Create(ctx, ep.ID, data) // Endpoint opened the bucket
		created = true
	case err == nil:
		rev, err = w.kv.Update(ctx, ep.ID, data, rev)
	}
	if err != nil {
		return false, fmt.Errorf("write webhook endpoint %q: %w", ep.ID, err)
	}
	return created, w.record(ctx, ConfigWebhookSet, actor, rev, ep)
}

// DeleteEndpoint removes endpoint id; rules.ErrNotFound when there is none.
func (w *Webhooks) DeleteEndpoint(ctx context.Context, id, actor string) error {
	ep, rev, err := w.Endpoint(ctx, id)
	if err != nil {
		return err
	}
	if err := w.kv.Delete(ctx, id, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("delete webhook endpoint %q: %w", id, err)
	}
	return w.record(ctx, ConfigWebhookDeleted, actor, rev+1, ep)
}

// record publishes the config event of an endpoint's change, its secret left out.
func (w *Webhooks) record(ctx context.Context, action, actor string, rev uint64, ep webhook.Endpoint) error {
	ep.Secret = webhook.Secret{}
	ev, err := configEvent(&events.ConfigEvent{Action: action, Actor: actor, WebhookID: ep.ID}, rev, w.now(), struct {
		ID       string   `json:"id"`
		URL      string   `json:"url"`
		Filter   []string `json:"filter,omitempty"`
		Disabled bool     `json:"disabled,omitempty"`
	}{ep.ID, ep.URL, ep.Filter, ep.Disabled})
	if err == nil {
		ev.ID = fmt.Sprintf("config-%s-%s-%d", action, ep.ID, rev)
		err = events.Publish(ctx, w.js, ev.NATSSubject(), ev.ID, ev)
	}
	if err != nil {
		return fmt.Errorf("webhook endpoint changed, but its event was not published: %w", err)
	}
	return nil
}

// bucketPoll is how often a follower looks for a bucket not created yet.
const bucketPoll = 5 * time.Second

// WatchEndpoints calls apply with every endpoint, then again after every change, until ctx
// ends (nil) or the watch fails. A store that binds (Config.Bind) first waits for the bucket,
// quietly: until the admin API's process creates it, there are no endpoints.
func (w *Webhooks) WatchEndpoints(ctx context.Context, apply func([]webhook.Endpoint)) error {
	var kv jetstream.KeyValue
	for kv == nil {
		var err error
		kv, err = w.bucket(ctx)
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrBucketNotFound):
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(bucketPoll):
			}
		default:
			return unlessEnded(ctx, fmt.Errorf("bind webhook endpoints: %w", err))
		}
	}
	watch, err := kv.WatchAll(ctx)
	if err != nil {
		return unlessEnded(ctx, fmt.Errorf("watch webhook endpoints: %w", err))
	}
	defer watch.Stop()
	eps := map[string]webhook.Endpoint{}
	ready := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watch.Updates():
			if !ok {
				return unlessEnded(ctx, errors.New("webhook endpoints watcher stopped"))
			}
			switch {
			case e == nil:
				ready = true // the initial values are in
			case e.Operation() != jetstream.KeyValuePut:
				delete(eps, e.Key())
			default:
				var ep webhook.Endpoint
				if err := json.Unmarshal(e.Value(), &ep); err != nil {
					w.log.Error("undecodable webhook endpoint skipped", "key", e.Key(), "err", err)
					continue
				}
				eps[e.Key()] = ep
			}
			if ready {
				list := make([]webhook.Endpoint, 0, len(eps))
				for _, ep := range eps {
					list = append(list, ep)
				}
				slices.SortFunc(list, func(a, b webhook.Endpoint) int { return strings.Compare(a.ID, b.ID) })
				apply(list)
			}
		}
	}
}
