package aggregator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// TestEntitlementEvents: the thresholds a decision's balance told become entitlement events on
// quotaflow.entitlements.<kind>, each with the decision's id in its own, and are stored in
// entitlement_events once; a custom dimension's holder is named as its grants name it.
func TestEntitlementEvents(t *testing.T) {
	t.Parallel()
	// A NATS server of its own: the events stream's name is fixed.
	e := newEnvOn(t, natstest.JetStream(t))
	ctx := context.Background()
	cfg := e.config("ent")
	cfg.EventsSubjects = []string{events.EntitlementsPrefix + ".>"}
	a, _ := e.startWith(cfg)
	if _, err := events.EnsureStream(ctx, e.js, 1); err != nil {
		t.Fatal(err)
	}
	sub, err := e.js.OrderedConsumer(ctx, events.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.EntitlementsPrefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	e.publishEdited(n, 3, func(d *quotaflowv1.Decision) {
		l := &quotaflowv1.LimitStatus{RuleId: "tokens", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "alice",
			Algorithm: "balance", Limit: 100, CurrentCount: 80, Remaining: 20, Allowed: true, ResetAt: time.Now().Add(time.Hour).Unix(),
			Told: []*quotaflowv1.ThresholdCrossing{{Kind: events.EntitlementUsedPercent, Threshold: 80}}}
		if d.Id[len(d.Id)-1]%2 == 0 {
			l.Dimension, l.Identifier = quotaflowv1.Dimension_DIMENSION_DESCRIPTOR, "tenant=ac%2Cme"
			l.Told = append(l.Told, &quotaflowv1.ThresholdCrossing{Kind: events.EntitlementGrantExpiring, Threshold: 3600000, GrantId: "promo"})
		}
		d.Limits = append(d.Limits, l)
	})
	got := map[string]events.EntitlementEvent{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n+n/2 && time.Now().Before(deadline) {
		msg, err := sub.Next(jetstream.FetchMaxWait(time.Second))
		if err != nil {
			continue
		}
		var ev events.EntitlementEvent
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if msg.Subject() != ev.NATSSubject() || msg.Headers().Get("Quotaflow-Event-Type") != ev.Type() {
			t.Errorf("event %s on %s, type %q", ev.ID, msg.Subject(), msg.Headers().Get("Quotaflow-Event-Type"))
		}
		got[ev.ID] = ev
	}
	if len(got) != n+n/2 {
		t.Fatalf("%d entitlement events, want %d: %v", len(got), n+n/2, got)
	}
	for id, ev := range got {
		switch {
		case ev.Entitlement != "tokens" || ev.Used != 80 || ev.Remaining != 20 || ev.DecisionID == "":
			t.Errorf("event %s: %+v", id, ev)
		case ev.Dimension == "tenant" && ev.Subject != "ac,me", ev.Dimension != "tenant" && (ev.Dimension != "user" || ev.Subject != "alice"):
			t.Errorf("event %s names its holder %s:%s", id, ev.Dimension, ev.Subject)
		case ev.Kind == events.EntitlementGrantExpiring && (ev.GrantID != "promo" || ev.Threshold != 3600000):
			t.Errorf("event %s: %+v, want the grant promo expiring within 1h", id, ev)
		}
	}
	stored := func() error {
		if c := e.count("SELECT count() FROM %s.entitlement_events"); c != n+n/2 {
			return fmt.Errorf("entitlement_events holds %d rows, want %d", c, n+n/2)
		}
		return nil
	}
	poll.Until(t, 30*time.Second, "the entitlement events stored", stored)
	if s := a.Stats(); s.EntitlementEvents != n+n/2 {
		t.Errorf("stats: %d entitlement events published, want %d", s.EntitlementEvents, n+n/2)
	}
}
