package aggregator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/webhook"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// fixedEndpoints is a webhook endpoint source that says its endpoints once and holds.
type fixedEndpoints []webhook.Endpoint

func (f fixedEndpoints) WatchEndpoints(ctx context.Context, apply func([]webhook.Endpoint)) error {
	apply(f)
	<-ctx.Done()
	return nil
}

// receiver is a webhook receiver that verifies each delivery's signature and keeps the ids it
// took; it fails the first attempt at each message.
type receiver struct {
	mu     sync.Mutex
	secret webhook.Secret
	tries  map[string]int
	took   map[string]events.EntitlementEvent
	bad    []string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := webhook.Verify(rc.secret, r.Header, body, time.Now(), 0); err != nil {
		rc.bad = append(rc.bad, err.Error())
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	id := r.Header.Get(webhook.HeaderID)
	if rc.tries[id]++; rc.tries[id] == 1 {
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	var ev events.EntitlementEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID != id {
		rc.bad = append(rc.bad, fmt.Sprintf("body %s for id %s", body, id))
	}
	rc.took[id] = ev
}

// TestWebhookDelivery: the entitlement events reach a registered endpoint as signed webhooks,
// their webhook-id the event's id, retried after a failure, and every attempt is in the
// delivery log.
func TestWebhookDelivery(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{secret: secret, tries: map[string]int{}, took: map[string]events.EntitlementEvent{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)

	e := newEnvOn(t, natstest.JetStream(t))
	cfg := e.config("hooks")
	cfg.EventsSubjects = []string{events.EntitlementsPrefix + ".>"}
	cfg.Webhooks = fixedEndpoints{{ID: "billing", URL: srv.URL + "/hooks", Secret: secret}}
	cfg.WebhookPolicy = webhook.URLPolicy{AllowHosts: []string{u.Host}}
	cfg.WebhookSchedule = webhook.Schedule{Delays: []time.Duration{100 * time.Millisecond}, Every: 100 * time.Millisecond, Span: time.Minute}
	e.startWith(cfg)
	const n = 4
	e.publishEdited(n, 2, func(d *quotaflowv1.Decision) {
		d.Limits = append(d.Limits, &quotaflowv1.LimitStatus{RuleId: "tokens", Dimension: quotaflowv1.Dimension_DIMENSION_USER,
			Identifier: "alice", Algorithm: "balance", Limit: 100, CurrentCount: 50, Remaining: 50, Allowed: true,
			Told: []*quotaflowv1.ThresholdCrossing{{Kind: events.EntitlementUsedPercent, Threshold: 50}}})
	})
	poll.Until(t, 60*time.Second, "every event delivered", func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.took) != n {
			return fmt.Errorf("%d of %d events delivered (%v refused)", len(rc.took), n, rc.bad)
		}
		return nil
	})
	rc.mu.Lock()
	for id, ev := range rc.took {
		if ev.Kind != events.EntitlementUsedPercent || ev.Threshold != 50 || ev.Subject != "alice" || rc.tries[id] != 2 {
			t.Errorf("delivery %s: %+v after %d tries; want used_percent 50 of alice, taken at the second", id, ev, rc.tries[id])
		}
	}
	if len(rc.bad) > 0 {
		t.Errorf("refused deliveries: %v", rc.bad)
	}
	rc.mu.Unlock()
	poll.Until(t, 30*time.Second, "the delivery log", func() error {
		got := e.count("SELECT count() FROM %s.webhook_deliveries WHERE endpoint = 'billing' AND outcome = 'delivered'")
		retried := e.count("SELECT count() FROM %s.webhook_deliveries WHERE endpoint = 'billing' AND outcome = 'retry' AND status = 503")
		if got != n || retried != n {
			return fmt.Errorf("the log holds %d deliveries and %d retries, want %d of each", got, retried, n)
		}
		return nil
	})
}
