package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/webhook"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Entitlement events come from the decisions: a check (or recorded usage) that crossed a
// threshold of an entitlement first says so in its balance's limit (LimitStatus.told), told by
// one check only (lua/balance.lua). The owner of the decision's partition publishes them as it
// applies the decisions to the warning states, before the messages may be acked, so that a
// message acked is a message whose crossings are on the events stream; a redelivered decision
// makes the same events again, with the same ids, which the stream's duplicate window and the
// receivers (by webhook-id) drop.

// appendCrossings appends the entitlement events of decision d to out.
func appendCrossings(out []events.EntitlementEvent, d *quotaflowv1.Decision) []events.EntitlementEvent {
	for _, l := range d.Limits {
		if len(l.Told) == 0 {
			continue
		}
		dim, subject := holder(l)
		for _, t := range l.Told {
			ev := events.EntitlementEvent{Kind: t.Kind, Entitlement: l.RuleId, Dimension: dim, Subject: subject, Tier: d.Tier,
				Threshold: t.Threshold, GrantID: t.GrantId, Used: l.CurrentCount, Remaining: l.Remaining,
				PeriodEnd: time.Unix(l.ResetAt, 0).UTC(), DecisionID: d.Id, At: time.UnixMicro(d.TimeUs).UTC()}
			ev.ID = d.Id + ":" + l.RuleId + ":" + t.Kind + ":" + strconv.FormatInt(t.Threshold, 10)
			if t.GrantId != "" {
				ev.ID += ":" + t.GrantId
			}
			out = append(out, ev)
		}
	}
	return out
}

// holder names a balance's holder as grants do: a custom dimension's name and value (its
// descriptor's one entry, "tenant=acme", written with %XX escapes), else the dimension's name
// and the identifier.
func holder(l *quotaflowv1.LimitStatus) (dim, subject string) {
	if l.Dimension == quotaflowv1.Dimension_DIMENSION_DESCRIPTOR {
		if k, v, ok := strings.Cut(l.Identifier, "="); ok {
			ku, err1 := url.PathUnescape(k)
			vu, err2 := url.PathUnescape(v)
			if err1 == nil && err2 == nil {
				return ku, vu
			}
			return k, v
		}
	}
	name := strings.ToLower(strings.TrimPrefix(l.Dimension.String(), "DIMENSION_"))
	if name == "api_key" {
		name = "apikey"
	}
	return name, l.Identifier
}

// publishCrossings publishes the entitlement events and waits for the stream to keep them.
func (a *Aggregator) publishCrossings(ctx context.Context, evs []events.EntitlementEvent) error {
	futures := make([]jetstream.PubAckFuture, len(evs))
	for i := range evs {
		data, err := json.Marshal(&evs[i])
		if err != nil {
			return fmt.Errorf("encode entitlement event: %w", err)
		}
		msg := &nats.Msg{Subject: evs[i].NATSSubject(), Data: data, Header: nats.Header{}}
		msg.Header.Set(webhook.TypeHeader, evs[i].Type())
		if futures[i], err = a.js.PublishMsgAsync(msg, jetstream.WithMsgID(evs[i].ID)); err != nil {
			return fmt.Errorf("publish entitlement event %s: %w", evs[i].ID, err)
		}
	}
	var errs []error
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if !ack.Duplicate {
				a.entitlementEvents.Add(1)
			}
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("publish entitlement event %s: %w", evs[i].ID, err))
		case <-ctx.Done():
			return fmt.Errorf("publish entitlement events: %w", ctx.Err())
		}
	}
	return errors.Join(errs...)
}
