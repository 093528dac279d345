package aggregator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
)

// OverrideStore is what the policies need of the rule store (rulestore.Store).
type OverrideStore interface {
	PutOverride(ctx context.Context, o rules.Override) error
	// RenewOverride moves an override's expiry in place; rules.ErrNotFound when it is gone.
	RenewOverride(ctx context.Context, id string, expires time.Time, actor string) error
	DeleteOverride(ctx context.Context, id, actor string) error
	Overrides(ctx context.Context) ([]rules.Override, error)
}

// PolicyConfig configures Policies. Rules, Store and JetStream are required.
type PolicyConfig struct {
	// Rules returns the rule set whose policies: apply (nil: none yet).
	Rules func() *rules.Set
	// Store keeps the overrides the policies make.
	Store OverrideStore
	// JetStream reads the warning transitions from EventsStream (events.Stream).
	JetStream    jetstream.JetStream
	EventsStream string
	// TierRate counts a tier's allowed checks since an instant (ClickHouseTierRate), those a
	// fail mode allowed included; nil disables tier protection.
	TierRate func(ctx context.Context, tier string, since time.Time) (int64, error)
	// Leader reports whether this process acts on the policies (nil: always). Every aggregator
	// follows the transitions; only the leader writes overrides.
	Leader func() bool
	// Interval is how often the policies are evaluated (1s).
	Interval time.Duration
	// MaxPenaltiesPerEvaluation bounds the penalty overrides one evaluation makes (100), so
	// that a wave of throttled subjects is penalized over several evaluations rather than
	// in one that holds up the next; MaxActivePenalties bounds those in force at once
	// (10,000): past it no more are made, and a warning says how many subjects wait.
	MaxPenaltiesPerEvaluation, MaxActivePenalties int
	// Logger receives the component's logs, with "component"="policies" (discarded when nil).
	Logger *slog.Logger
	// Meter records the tier protection's gauges (none when nil): per tier of a tier_protection
	// policy, the allowed checks counted over its window and its capacity, as of the leader's
	// last evaluation.
	Meter metric.Meter
}

// Policies makes the automatic overrides of a rules document's policies:
//   - penalty: a subject throttled on a rule for more than Throttled of the last Within gets
//     that rule's limit multiplied by Factor for Duration (abuse dampening);
//   - tier protection: while a tier's allowed checks over the last Window exceed Capacity, the
//     tier's limits are multiplied by Factor (load shedding); the override lasts Duration, is
//     renewed (its expiry moved, in place) while the rate stays above, and is deleted once the
//     rate falls back. A tier has at most one such override: a second would multiply with the
//     first (×0.5 twice is ×0.25).
//
// Every override it makes or deletes goes through the rule store, so it is an event on
// quotaflow.overrides.> and a row in ClickHouse like an admin's. Overrides expire by
// themselves, so a leader that dies leaves nothing in force for longer than Duration.
type Policies struct {
	cfg  PolicyConfig
	log  *slog.Logger
	keys map[string]*penaltyKey

	// loads are the tiers' loads of the last evaluation, for the gauges: only the leader's
	// evaluation counts them, so another aggregator reports none, and a tier whose count failed
	// is left out rather than reported with a stale count.
	mu    sync.Mutex
	loads map[string]tierLoad
}

// tierLoad is a tier's allowed checks over its protection window, and its capacity.
type tierLoad struct{ allowed, capacity int64 }

// penaltyKey is what the penalty needs to know of one subject and rule.
type penaltyKey struct {
	dimension, subject, rule string
	spans                    []span    // throttled spans that ended, oldest first
	since                    time.Time // start of the throttled span in progress; zero when not throttled
	// after is when the key's last penalty began: throttled time before it was paid for and
	// does not count again.
	after time.Time
}

type span struct{ from, to time.Time }

// The penalty bounds' defaults (PolicyConfig).
const (
	DefaultMaxPenaltiesPerEvaluation = 100
	DefaultMaxActivePenalties        = 10_000
)

// NewPolicies returns Policies for cfg.
func NewPolicies(cfg PolicyConfig) *Policies {
	if cfg.EventsStream == "" {
		cfg.EventsStream = events.Stream
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.MaxPenaltiesPerEvaluation <= 0 {
		cfg.MaxPenaltiesPerEvaluation = DefaultMaxPenaltiesPerEvaluation
	}
	if cfg.MaxActivePenalties <= 0 {
		cfg.MaxActivePenalties = DefaultMaxActivePenalties
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Policies{cfg: cfg, log: cfg.Logger.With("component", "policies"), keys: map[string]*penaltyKey{}}
	if cfg.Meter != nil {
		if err := p.gauges(cfg.Meter); err != nil {
			p.log.Warn("policies: gauges not registered; tier protection runs without them", "err", err)
		}
	}
	return p
}

// gauges registers the tier protection's gauges, quotaflow.aggregator.tier.allowed and
// quotaflow.aggregator.tier.capacity (attribute tier): a tier above its capacity is allowed >
// capacity.
func (p *Policies) gauges(m metric.Meter) error {
	allowed, err := m.Int64ObservableGauge("quotaflow.aggregator.tier.allowed", metric.WithDescription(
		"Allowed checks of a tier over its tier_protection window, as the leader aggregator last counted them (attribute tier); only the leader reports it."))
	if err != nil {
		return err
	}
	capacity, err := m.Int64ObservableGauge("quotaflow.aggregator.tier.capacity", metric.WithDescription(
		"Capacity of a tier's tier_protection policy: allowed checks over its window past which the tier's limits are scaled down (attribute tier); only the leader reports it."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		for tier, l := range p.loads {
			set := metric.WithAttributeSet(attribute.NewSet(attribute.String("tier", tier)))
			o.ObserveInt64(allowed, l.allowed, set)
			o.ObserveInt64(capacity, l.capacity, set)
		}
		return nil
	}, allowed, capacity)
	return err
}

// Run follows the warning transitions (from as far back as the penalty window, so a restarted
// aggregator knows the recent past) and evaluates the policies every Interval until ctx ends.
// It returns early, to be run again, when NATS stays unreachable.
func (p *Policies) Run(ctx context.Context) error {
	within := time.Hour
	if set := p.rules(); set != nil && set.Policies().Penalty != nil {
		within = set.Policies().Penalty.Within
	}
	cons, err := p.cfg.JetStream.OrderedConsumer(ctx, p.cfg.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.WarningsPrefix + ".>"},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   new(time.Now().Add(-within)),
		// Unlimited resets retry forever while NATS is down, deaf to ctx: give up after two
		// and let Run's caller start again, from the transitions of the last window.
		MaxResetAttempts: 2,
	})
	if err != nil {
		return fmt.Errorf("follow warning transitions: %w", err)
	}
	clear(p.keys) // rebuilt from the window's transitions
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(p.cfg.Interval))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("follow warning transitions: %w", err)
		}
		for msg := range batch.Messages() {
			var t events.Transition
			if err := json.Unmarshal(msg.Data(), &t); err != nil {
				p.log.Warn("undecodable warning transition skipped", "subject", msg.Subject(), "err", err)
				continue
			}
			p.observe(t)
		}
		select {
		case <-tick.C:
			// Bounded: a request in flight when its NATS server dies is never answered.
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			p.evaluate(ectx, time.Now())
			cancel()
		default:
		}
	}
	return nil
}

func (p *Policies) rules() *rules.Set {
	if p.cfg.Rules == nil {
		return nil
	}
	return p.cfg.Rules()
}

// observe records a transition into or out of Throttled.
func (p *Policies) observe(t events.Transition) {
	k := t.Dimension + "\x00" + t.Subject + "\x00" + t.RuleID
	pk := p.keys[k]
	if pk == nil {
		if t.To != events.StateThrottled {
			return
		}
		pk = &penaltyKey{dimension: t.Dimension, subject: t.Subject, rule: t.RuleID}
		p.keys[k] = pk
	}
	switch {
	case t.To == events.StateThrottled && pk.since.IsZero():
		pk.since = t.At
	case t.From == events.StateThrottled && t.To != events.StateThrottled && !pk.since.IsZero():
		pk.spans = append(pk.spans, span{pk.since, t.At})
		pk.since = time.Time{}
	}
}

// throttledWithin is how long the key was throttled in (now-within, now].
func (pk *penaltyKey) throttledWithin(now time.Time, within time.Duration) time.Duration {
	from := now.Add(-within)
	if pk.after.After(from) {
		from = pk.after
	}
	var total time.Duration
	add := func(a, b time.Time) {
		if a.Before(from) {
			a = from
		}
		if b.After(a) {
			total += b.Sub(a)
		}
	}
	for _, s := range pk.spans {
		add(s.from, s.to)
	}
	if !pk.since.IsZero() {
		add(pk.since, now)
	}
	return total
}

// evaluate applies both policies at now. Only the leader writes.
func (p *Policies) evaluate(ctx context.Context, now time.Time) {
	loads := map[string]tierLoad{}
	defer func() {
		p.mu.Lock()
		p.loads = loads
		p.mu.Unlock()
	}()
	set := p.rules()
	if set == nil {
		return
	}
	pol := set.Policies()
	p.prune(now, pol.Penalty)
	if p.cfg.Leader != nil && !p.cfg.Leader() {
		return
	}
	if pol.Penalty == nil && (len(pol.TierProtection) == 0 || p.cfg.TierRate == nil) {
		return
	}
	active, err := p.cfg.Store.Overrides(ctx)
	if err != nil && ctx.Err() != nil {
		return // stopping
	}
	if err != nil {
		p.log.Warn("policies: list overrides failed; evaluating next time", "err", err)
		return
	}
	// Tier protection first: a few reads per tier, on schedule whatever the penalties have to
	// do, which are bounded per evaluation.
	if p.cfg.TierRate != nil {
		for _, tp := range pol.TierProtection {
			p.protect(ctx, now, tp, active, loads)
		}
	}
	if pol.Penalty != nil {
		p.penalize(ctx, now, *pol.Penalty, active)
	}
}

// prune forgets spans older than the penalty window, and keys left with nothing.
func (p *Policies) prune(now time.Time, pe *rules.Penalty) {
	within := time.Hour
	if pe != nil {
		within = pe.Within
	}
	for k, pk := range p.keys {
		i := 0
		for i < len(pk.spans) && pk.spans[i].to.Before(now.Add(-within)) {
			i++
		}
		pk.spans = pk.spans[i:]
		if len(pk.spans) == 0 && pk.since.IsZero() {
			delete(p.keys, k)
		}
	}
}

func (p *Policies) penalize(ctx context.Context, now time.Time, pe rules.Penalty, active []rules.Override) {
	penalties := activePenalties(active)
	made, waiting := 0, 0
	for _, pk := range p.keys {
		if o, ok := penalties[penaltyTarget{pk.dimension, pk.subject, pk.rule}]; ok {
			pk.after = o.CreatedAt
			continue
		}
		throttled := pk.throttledWithin(now, pe.Within)
		if throttled <= pe.Throttled {
			continue
		}
		if made >= p.cfg.MaxPenaltiesPerEvaluation || len(penalties)+made >= p.cfg.MaxActivePenalties {
			waiting++ // made by a later evaluation, if still due then
			continue
		}
		// Named by the key and the start of the throttled time that crossed the threshold: a
		// second evaluation (or a second leader) makes the same id, which the store refuses.
		start := pk.since
		if start.IsZero() && len(pk.spans) > 0 {
			start = pk.spans[len(pk.spans)-1].from
		}
		o := rules.Override{
			ID:        "penalty-" + shortHash(pk.dimension, pk.subject, pk.rule) + fmt.Sprintf("-%d", start.UnixMilli()),
			Dimension: pk.dimension, Identifier: pk.subject, RuleID: pk.rule, Multiplier: pe.Factor,
			Reason:  fmt.Sprintf("penalty: throttled %s of the last %s (more than %s)", throttled.Round(time.Millisecond), pe.Within, pe.Throttled),
			Creator: "policy:penalty", Source: "penalty", CreatedAt: now, ExpiresAt: now.Add(pe.Duration),
		}
		if p.put(ctx, o) {
			pk.after = now
			made++
		}
	}
	if waiting > 0 {
		p.log.Warn("penalties capped: subjects due a penalty wait for a later evaluation", "waiting", waiting, "made", made,
			"active", len(penalties)+made, "max_per_evaluation", p.cfg.MaxPenaltiesPerEvaluation, "max_active", p.cfg.MaxActivePenalties)
	}
}

// penaltyTarget is what a penalty override is of: a subject on a rule.
type penaltyTarget struct{ dimension, subject, rule string }

// activePenalties indexes the penalty overrides in force by their target, once per
// evaluation: looking each key up in the list made an evaluation quadratic.
func activePenalties(active []rules.Override) map[penaltyTarget]rules.Override {
	m := map[penaltyTarget]rules.Override{}
	for _, o := range active {
		if o.Source == "penalty" {
			m[penaltyTarget{o.Dimension, o.Identifier, o.RuleID}] = o
		}
	}
	return m
}

// protect applies a tier protection policy at now, and records the tier's load in loads.
func (p *Policies) protect(ctx context.Context, now time.Time, tp rules.TierProtection, active []rules.Override, loads map[string]tierLoad) {
	rate, err := p.cfg.TierRate(ctx, tp.Tier, now.Add(-tp.Window))
	if err != nil {
		p.log.Warn("tier protection: counting the tier's checks failed; evaluating next time", "tier", tp.Tier, "err", err)
		return
	}
	loads[tp.Tier] = tierLoad{allowed: rate, capacity: tp.Capacity}
	var mine []rules.Override
	for _, o := range active {
		if o.Source == "tier_protection" && o.Tier == tp.Tier {
			mine = append(mine, o)
		}
	}
	if rate <= tp.Capacity {
		for _, o := range mine {
			if err := p.cfg.Store.DeleteOverride(ctx, o.ID, "policy:tier_protection"); err != nil && !errors.Is(err, rules.ErrNotFound) {
				p.log.Warn("tier protection: lifting failed; it expires by itself", "tier", tp.Tier, "override", o.ID, "err", err)
				continue
			}
			p.log.Info("tier protection lifted", "tier", tp.Tier, "allowed", rate, "capacity", tp.Capacity, "window", tp.Window)
		}
		return
	}
	// Above capacity: keep one override in force, renewed in place before it runs out. Only
	// when none is left (or renewing failed because it just went) is a new one made.
	if len(mine) > 0 {
		p.renew(ctx, now, tp, mine)
		return
	}
	o := rules.Override{
		ID:   fmt.Sprintf("tier-protection-%s-%d", shortHash(tp.Tier), now.UnixMilli()),
		Tier: tp.Tier, Multiplier: tp.Factor,
		Reason:  fmt.Sprintf("tier protection: %d allowed checks in the last %s, capacity %d", rate, tp.Window, tp.Capacity),
		Creator: "policy:tier_protection", Source: "tier_protection", CreatedAt: now, ExpiresAt: now.Add(tp.Duration),
	}
	if p.put(ctx, o) {
		p.log.Info("tier protection engaged", "tier", tp.Tier, "allowed", rate, "capacity", tp.Capacity, "factor", tp.Factor)
	}
}

// renew keeps the newest of a tier's protection overrides in force, moving its expiry to
// now+Duration once less than half of Duration is left, and deletes any other: several exist
// only when made before renewal existed, or by two leaders at once, and they would compound.
func (p *Policies) renew(ctx context.Context, now time.Time, tp rules.TierProtection, mine []rules.Override) {
	keep := mine[0]
	for _, o := range mine[1:] {
		if o.CreatedAt.After(keep.CreatedAt) {
			keep = o
		}
	}
	for _, o := range mine {
		if o.ID == keep.ID {
			continue
		}
		if err := p.cfg.Store.DeleteOverride(ctx, o.ID, "policy:tier_protection"); err != nil && !errors.Is(err, rules.ErrNotFound) {
			p.log.Warn("tier protection: removing a duplicate failed; it expires by itself", "tier", tp.Tier, "override", o.ID, "err", err)
		}
	}
	if keep.ExpiresAt.Sub(now) > tp.Duration/2 {
		return
	}
	expires := now.Add(tp.Duration)
	if err := p.cfg.Store.RenewOverride(ctx, keep.ID, expires, "policy:tier_protection"); err != nil {
		// Gone meanwhile (expired, or deleted by an admin): the next evaluation makes a new one.
		p.log.Warn("tier protection: renewal failed; evaluating next time", "tier", tp.Tier, "override", keep.ID, "err", err)
		return
	}
	p.log.Info("tier protection renewed", "tier", tp.Tier, "override", keep.ID, "expires", expires)
}

func (p *Policies) put(ctx context.Context, o rules.Override) bool {
	err := p.cfg.Store.PutOverride(ctx, o)
	switch {
	case err == nil:
		p.log.Info("policy override made", "override", o.ID, "source", o.Source, "reason", o.Reason)
		return true
	case errors.Is(err, rules.ErrExists):
	default:
		p.log.Warn("policy override not made; evaluating next time", "override", o.ID, "err", err)
	}
	return false
}

func shortHash(parts ...string) string {
	h := sha256.New()
	for _, s := range parts {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ClickHouseTierRate counts a tier's allowed decisions in db.decisions since an instant: the
// whole fleet's, whichever checker decided and whichever aggregator stored them. Checks a fail
// mode allowed while Redis did not answer (degraded) are counted: they reached the upstream
// as surely as the others, and its capacity is what the policy protects.
func ClickHouseTierRate(conn driver.Conn, db string) func(ctx context.Context, tier string, since time.Time) (int64, error) {
	q := "SELECT count() FROM " + db + ".decisions WHERE tier = ? AND allowed = 1 AND time >= toDateTime(?)"
	return func(ctx context.Context, tier string, since time.Time) (int64, error) {
		var n uint64
		if err := conn.QueryRow(ctx, q, tier, since.Unix()).Scan(&n); err != nil {
			return 0, fmt.Errorf("count allowed checks of tier %q: %w", tier, err)
		}
		return int64(n), nil
	}
}
