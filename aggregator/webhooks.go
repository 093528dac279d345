package aggregator

import (
	"context"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/retry"
	"github.com/quotaflow/quotaflow/internal/webhook"
	"github.com/quotaflow/quotaflow/schema"
)

// WebhookEndpoints is where the aggregator learns the webhook endpoints: the admin API's
// store of them (package rulestore), followed for as long as the aggregator runs.
type WebhookEndpoints interface {
	// WatchEndpoints calls apply with every endpoint, then again after every change, until
	// ctx ends (nil) or the watch fails.
	WatchEndpoints(ctx context.Context, apply func([]webhook.Endpoint)) error
}

// webhookLoop delivers the entitlement events to the endpoints until ctx ends: a dispatcher
// (package webhook) on the events stream's entitlement subjects, its endpoints those the
// watch reports, restarted with backoff when it fails. A dead or slow endpoint holds only its
// own consumer: the dispatcher's loops are its own goroutines, apart from the partitions'
// and the inserts.
func (a *Aggregator) webhookLoop(ctx context.Context) {
	d, err := webhook.New(a.js, webhook.Config{
		Stream: events.Stream, Subjects: []string{events.EntitlementsPrefix + ".>"}, Policy: a.cfg.WebhookPolicy,
		Schedule: a.cfg.WebhookSchedule, Log: deliveryLog{a}, Logger: a.cfg.Logger,
	})
	if err != nil {
		a.log.Error("webhooks not delivered", "err", err)
		return
	}
	defer d.Close()
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for ctx.Err() == nil {
		err := a.cfg.Webhooks.WatchEndpoints(ctx, func(eps []webhook.Endpoint) {
			b = retry.Backoff{Max: a.cfg.MaxBackoff}
			if err := d.SetEndpoints(eps); err != nil {
				// One bad endpoint (written past the admin API's checks) must not stop the
				// others: each is set alone, the bad one left out.
				a.setEach(d, eps, err)
			}
		})
		if err == nil {
			return
		}
		wait := b.Next()
		a.log.Warn("watching the webhook endpoints failed; retrying", "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// setEach sets the endpoints of eps that pass the dispatcher's checks, logging the others.
func (a *Aggregator) setEach(d *webhook.Dispatcher, eps []webhook.Endpoint, err error) {
	var good []webhook.Endpoint
	for _, ep := range eps {
		if e := d.SetEndpoints(append(good[:len(good):len(good)], ep)); e != nil {
			a.log.Error("webhook endpoint left out", "endpoint", ep.ID, "err", e)
			continue
		}
		good = append(good, ep)
	}
	if e := d.SetEndpoints(good); e != nil {
		a.log.Error("webhook endpoints not set", "err", e, "first", err)
	}
}

// deliveryLog records the dispatcher's attempts in ClickHouse (webhook_deliveries).
type deliveryLog struct{ a *Aggregator }

var _ webhook.Log = deliveryLog{}

// Record inserts one attempt. A failed insert loses the log line, not the delivery: the
// dispatcher logs it and goes on.
func (l deliveryLog) Record(ctx context.Context, endpoint, msgID string, at webhook.Attempt) error {
	a := l.a
	batch, err := a.ch.PrepareBatch(ctx, "INSERT INTO "+a.cfg.Database+"."+a.layout().Storage(schema.WebhookDeliveries)+
		" (at, endpoint, message_id, attempt, status, outcome, error, duration_ms, next_ms)")
	if err != nil {
		return err
	}
	if err := batch.Append(at.At.UTC(), endpoint, msgID, uint32(max(at.N, 0)), uint16(min(max(at.Status, 0), 65535)), at.Outcome(), at.Err,
		uint32(at.Duration/time.Millisecond), uint64(max(at.Next, 0)/time.Millisecond)); err != nil {
		batch.Abort()
		return err
	}
	return batch.Send()
}
