package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/retry"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/schema"
)

// ensureEventsStream creates the events stream when it is missing. An existing one keeps its
// settings — its replicas are the rule store's to set — but gets the subjects of the event
// kinds it lacks (a stream made before config events), without which the events consumer
// could not be created on them.
func (a *Aggregator) ensureEventsStream(ctx context.Context) error {
	st, err := a.js.Stream(ctx, events.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = events.EnsureStream(ctx, a.js, a.cfg.Replicas)
		return err
	} else if err != nil {
		return fmt.Errorf("events stream: %w", err)
	}
	cfg := st.CachedInfo().Config
	missing := false
	for _, s := range events.Subjects() {
		if !slices.Contains(cfg.Subjects, s) {
			cfg.Subjects, missing = append(cfg.Subjects, s), true
		}
	}
	if !missing {
		return nil
	}
	if _, err := a.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("events stream: add subjects: %w", err)
	}
	return nil
}

// storedEvent is one events-stream message, decoded, bound for one table: exactly one of
// transition, override, config and entitlement is set.
type storedEvent struct {
	msg         jetstream.Msg
	seq         uint64
	transition  *events.Transition
	override    *events.OverrideEvent
	config      *events.ConfigEvent
	entitlement *events.EntitlementEvent
}

func (e *storedEvent) id() string {
	switch {
	case e.transition != nil:
		return e.transition.ID
	case e.override != nil:
		return e.override.ID
	case e.entitlement != nil:
		return e.entitlement.ID
	}
	return e.config.ID
}

func (e *storedEvent) at() time.Time {
	switch {
	case e.transition != nil:
		return e.transition.At
	case e.override != nil:
		return e.override.At
	case e.entitlement != nil:
		return e.entitlement.At
	}
	return e.config.At
}

// eventsLoop stores the events stream in ClickHouse (state_transitions, overrides,
// config_changes) through one durable consumer that every aggregator pulls. Each event's id is
// looked up before it is inserted, and its message is acked only after the insert: an event
// redelivered, or re-published after the stream's duplicate window, is stored once.
func (a *Aggregator) eventsLoop(ctx context.Context) {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	var cons jetstream.Consumer
	for {
		cctx, cancel := apiContext(ctx)
		var err error
		cons, err = a.js.CreateOrUpdateConsumer(cctx, events.Stream, jetstream.ConsumerConfig{
			Durable:        a.cfg.EventsConsumer,
			Description:    "quotaflow aggregators: warning transitions, override, configuration changes and entitlement events into ClickHouse",
			FilterSubjects: a.cfg.EventsSubjects,
			AckPolicy:      jetstream.AckExplicitPolicy,
			AckWait:        a.cfg.AckWait,
			MaxDeliver:     -1,
			MaxAckPending:  10000,
			DeliverPolicy:  jetstream.DeliverAllPolicy,
		})
		cancel()
		if err == nil {
			break
		}
		wait := b.Next()
		a.log.Warn("create events consumer failed; retrying", "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
	wait := min(time.Second, a.cfg.PinnedTTL/4)
	for ctx.Err() == nil {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(wait))
		if err != nil {
			if !retry.Sleep(ctx, b.Next()) {
				return
			}
			continue
		}
		b = retry.Backoff{Max: a.cfg.MaxBackoff}
		var evs []storedEvent
		for msg := range batch.Messages() {
			ev, err := decodeEvent(msg)
			if err != nil {
				a.log.Error("undecodable event terminated", "subject", msg.Subject(), "err", err)
				msg.Term()
				continue
			}
			evs = append(evs, ev)
		}
		if len(evs) > 0 && !a.storeEvents(ctx, evs) {
			return // the messages are redelivered after the ack wait
		}
	}
}

func decodeEvent(msg jetstream.Msg) (storedEvent, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return storedEvent{}, fmt.Errorf("event metadata: %w", err)
	}
	ev := storedEvent{msg: msg, seq: meta.Sequence.Stream}
	kind, err := events.Kind(msg.Subject())
	if err != nil {
		return ev, err
	}
	switch kind {
	case "warning":
		ev.transition = &events.Transition{}
		err = json.Unmarshal(msg.Data(), ev.transition)
	case "override":
		ev.override = &events.OverrideEvent{}
		err = json.Unmarshal(msg.Data(), ev.override)
	case "entitlement":
		ev.entitlement = &events.EntitlementEvent{}
		err = json.Unmarshal(msg.Data(), ev.entitlement)
	default:
		ev.config = &events.ConfigEvent{}
		err = json.Unmarshal(msg.Data(), ev.config)
	}
	if err == nil && ev.id() == "" {
		err = errors.New("event without an id")
	}
	if err != nil {
		return ev, fmt.Errorf("event at stream sequence %d: %w", ev.seq, err)
	}
	return ev, nil
}

// storeEvents inserts the events ClickHouse does not hold yet and acks them all, retrying
// with backoff while ClickHouse fails; false when ctx ended first.
func (a *Aggregator) storeEvents(ctx context.Context, evs []storedEvent) bool {
	b := retry.Backoff{Max: a.cfg.MaxBackoff}
	for {
		n, err := a.storeEventsOnce(ctx, evs)
		if err == nil {
			for _, ev := range evs {
				ev.msg.Ack()
			}
			return true
		}
		a.clickhouseErrors.Add(1)
		a.m.clickhouseErrors.Add(context.Background(), 1)
		wait := b.Next()
		a.log.Warn("storing events failed; holding their acks and retrying", "events", len(evs), "stored", n, "err", err, "retry_in", wait)
		if !retry.Sleep(ctx, wait) {
			return false
		}
	}
}

// storeEventsOnce inserts, table by table, the events whose ids ClickHouse does not hold (and
// each id once); it returns how many it stored.
func (a *Aggregator) storeEventsOnce(ctx context.Context, evs []storedEvent) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.InsertTimeout)
	defer cancel()
	stored := 0
	for _, t := range []struct {
		table, idCol, kind string
		isKind             func(*storedEvent) bool
	}{
		{"state_transitions", "id", "warning", func(e *storedEvent) bool { return e.transition != nil }},
		{"overrides", "event_id", "override", func(e *storedEvent) bool { return e.override != nil }},
		{"config_changes", "event_id", "config", func(e *storedEvent) bool { return e.config != nil }},
		{"entitlement_events", "event_id", "entitlement", func(e *storedEvent) bool { return e.entitlement != nil }},
	} {
		var mine []*storedEvent
		for i := range evs {
			if t.isKind(&evs[i]) {
				mine = append(mine, &evs[i])
			}
		}
		if len(mine) == 0 {
			continue
		}
		have, err := a.storedEventIDs(ctx, t.table, t.idCol, mine)
		if err != nil {
			return stored, err
		}
		var fresh []*storedEvent
		for _, e := range mine {
			if !have[e.id()] {
				have[e.id()] = true
				fresh = append(fresh, e)
			}
		}
		if len(fresh) == 0 {
			continue
		}
		if err := a.insertEvents(ctx, t.table, fresh); err != nil {
			return stored, err
		}
		stored += len(fresh)
		a.eventsStored.Add(int64(len(fresh)))
		a.m.eventsStored.Add(context.Background(), int64(len(fresh)), metric.WithAttributes(attribute.String("kind", t.kind)))
	}
	return stored, nil
}

// storedEventIDs returns which of the events' ids the table holds. A copy has its original's
// instant, so the lookup reads only the partitions of the events' instants.
func (a *Aggregator) storedEventIDs(ctx context.Context, table, idCol string, evs []*storedEvent) (map[string]bool, error) {
	lo, hi := evs[0].at(), evs[0].at()
	ids := make([]string, len(evs))
	for i, e := range evs {
		lo, hi = minTime(lo, e.at()), maxTime(hi, e.at())
		ids[i] = quote(e.id())
	}
	q := fmt.Sprintf("SELECT %s FROM %s.%s WHERE at >= toDateTime(%d) AND at <= toDateTime(%d) AND %s IN (%s)",
		idCol, a.cfg.Database, table, max(0, lo.Unix()-1), max(0, hi.Unix()+1), idCol, strings.Join(ids, ", "))
	rows, err := a.ch.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("look up stored events in %s: %w", table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("look up stored events in %s: %w", table, err)
		}
		have[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up stored events in %s: %w", table, err)
	}
	return have, nil
}

const (
	transitionColumns  = "id, at, at_us, tier, dimension, subject, rule_id, from_state, to_state, usage_ratio, limit_value, remaining, window_ms, cause, stream_seq, ingested_at"
	overrideColumns    = "event_id, action, at, actor, override_id, target, dimension, identifier, tier, rule_id, limit_value, multiplier, reason, creator, source, created_at, expires_at, stream_seq, ingested_at"
	configColumns      = "event_id, at, action, actor, target, tier, detail, stream_seq, ingested_at"
	entitlementColumns = "event_id, at, kind, entitlement, dimension, subject, tier, threshold, grant_id, used, remaining, period_end, decision_id, stream_seq, ingested_at"
)

func (a *Aggregator) insertEvents(ctx context.Context, table string, evs []*storedEvent) error {
	cols := transitionColumns
	switch table {
	case "overrides":
		cols = overrideColumns
	case "config_changes":
		cols = configColumns
	case "entitlement_events":
		cols = entitlementColumns
	}
	batch, err := a.ch.PrepareBatch(ctx, "INSERT INTO "+a.cfg.Database+"."+a.layout().Storage(schema.Table(table))+" ("+cols+")")
	if err != nil {
		return fmt.Errorf("prepare insert into %s: %w", table, err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, e := range evs {
		switch {
		case e.transition != nil:
			t := e.transition
			err = batch.Append(t.ID, t.At.UTC(), t.At.UnixMicro(), t.Tier, t.Dimension, t.Subject, t.RuleID, t.From, t.To,
				t.UsageRatio, t.Limit, t.Remaining, t.WindowMs, t.Cause, e.seq, now)
		case e.config != nil:
			c := e.config
			err = batch.Append(c.ID, c.At.UTC(), c.Action, c.Actor, c.Target(), c.Tier, string(c.Detail), e.seq, now)
		case e.entitlement != nil:
			x := e.entitlement
			err = batch.Append(x.ID, x.At.UTC(), x.Kind, x.Entitlement, x.Dimension, x.Subject, x.Tier, x.Threshold, x.GrantID,
				x.Used, x.Remaining, x.PeriodEnd.UTC(), x.DecisionID, e.seq, now)
		default:
			o := e.override
			err = batch.Append(o.ID, o.Action, o.At.UTC(), o.Actor, o.Override.ID, o.Override.Target(), o.Override.Dimension,
				o.Override.Identifier, o.Override.Tier, o.Override.RuleID, o.Override.Limit, o.Override.Multiplier,
				o.Override.Reason, o.Override.Creator, o.Override.Source, o.Override.CreatedAt.UTC(), o.Override.ExpiresAt.UTC(), e.seq, now)
		}
		if err != nil {
			batch.Abort()
			return fmt.Errorf("append to %s: %w", table, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("insert %d events into %s: %w", len(evs), table, err)
	}
	return nil
}

// quote makes s a ClickHouse string literal.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
