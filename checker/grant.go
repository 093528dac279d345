package checker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
)

// An entitlement's balances live in the same Redis as the buckets, one hash per subject
// (lua/balance.lua), under the subject's hash tag, so that a check burns a balance in the same
// script run as its other limits. The engine writes their grants for the admin API (PutGrant,
// VoidGrant) and reads them (Balance), knowing their keys and periods.

// grantStore is what the engine asks of the store for balances.
type grantStore interface {
	PutGrant(ctx context.Context, key string, g bucket.Grant, periods calendar.Span) (bucket.Balance, error)
	VoidGrant(ctx context.Context, key, id string, periods calendar.Span) (bucket.Balance, error)
	ReadBalance(ctx context.Context, key string, periods calendar.Span) (bucket.Balance, error)
	UseBalance(ctx context.Context, key, record string, l bucket.Limit, amount int64, ttl time.Duration) (bucket.Use, error)
}

var _ grantStore = (*bucket.Store)(nil)

// Balance is a subject's balance of an entitlement in the period that holds Redis's time.
type Balance struct {
	Entitlement string
	// Dimension and Subject name the holder, as a grant does (rules.Grant).
	Dimension, Subject string
	// PeriodStart and PeriodEnd bound the period; Used is what was charged in it, Overage the
	// part of that a soft entitlement let past a zero balance.
	PeriodStart, PeriodEnd time.Time
	Used, Overage          int64
	// Remaining is the sum of what the live grants have left.
	Remaining int64
	Grants    []GrantBalance
}

// GrantBalance is one grant of a Balance: its definition, what it has left, whether it counts
// now, and the period it was last issued for. A recurring grant's rollover into a period is a
// grant of its own, "<id>~<period start, Unix s>", without a reason.
type GrantBalance struct {
	rules.Grant
	Remaining int64
	Live      bool
	IssuedFor time.Time
}

// grantMeta is what the store keeps beside a grant for reads: what its numbers do not say.
type grantMeta struct {
	Reason  string `json:"reason,omitempty"`
	Creator string `json:"creator,omitempty"`
}

// PutGrant makes g in its subject's balance and returns it as made (validated and completed by
// the rules in force, Set.ValidateGrant, whose *field.Error names a bad field; an empty ID made
// a random one) with the balance after. Making the same grant again (a retry) changes nothing; another grant with its
// id is rules.ErrExists, and a subject holding bucket.MaxGrants grants is a *field.Error on
// subject. With the store unreachable it fails with ErrUnavailable.
func (e *Engine) PutGrant(ctx context.Context, g rules.Grant) (rules.Grant, Balance, error) {
	set := e.rules.Load()
	if set == nil {
		return g, Balance{}, ErrNoRules
	}
	now := time.Now()
	if err := set.ValidateGrant(&g, now); err != nil {
		return g, Balance{}, err
	}
	if g.ID == "" {
		var b [8]byte
		rand.Read(b[:]) // never fails (crypto/rand panics where randomness is unavailable)
		g.ID = "gr-" + hex.EncodeToString(b[:])
	}
	ent, _ := set.Entitlement(g.Entitlement)
	meta, err := json.Marshal(grantMeta{Reason: g.Reason, Creator: g.Creator})
	if err != nil {
		return g, Balance{}, fmt.Errorf("encode grant %q: %w", g.ID, err)
	}
	bg := bucket.Grant{ID: g.ID, Amount: g.Amount, Priority: int64(g.Priority), Effective: g.EffectiveAt, Expires: g.ExpiresAt,
		Recurring: g.Recurring, Meta: string(meta)}
	if g.Rollover != nil {
		bg.RolloverMin, bg.RolloverMax = g.Rollover.Min, g.Rollover.Max
	}
	b, err := e.balanceOp(ctx, ent, g.Subject, now, func(ctx context.Context, gs grantStore, key string, sp calendar.Span) (bucket.Balance, error) {
		b, err := gs.PutGrant(ctx, key, bg, sp)
		switch {
		case errors.Is(err, bucket.ErrGrantExists):
			return b, fmt.Errorf("grant %q of %s %s: another grant has that id: %w", g.ID, g.Dimension, g.Subject, rules.ErrExists)
		case errors.Is(err, bucket.ErrTooManyGrants):
			return b, field.Errorf("subject", "%s %s holds %d grants of %s, the most one subject may", g.Dimension, g.Subject, bucket.MaxGrants, ent.ID)
		}
		return b, err
	})
	for _, made := range b.Grants {
		if made.ID == g.ID {
			return made.Grant, b, err
		}
	}
	return g, b, err
}

// VoidGrant voids grant id of subject's balance of entitlement from now on (what it paid for
// stays paid) and returns the balance after. An unknown entitlement or grant is
// rules.ErrNotFound; with the store unreachable it fails with ErrUnavailable.
func (e *Engine) VoidGrant(ctx context.Context, entitlement, subject, id string) (Balance, error) {
	ent, err := e.entitlement(entitlement, subject)
	if err != nil {
		return Balance{}, err
	}
	if id == "" || len(id) > MaxEntitlementLen {
		return Balance{}, field.Errorf("id", "want a grant's id, 1 to %d bytes", MaxEntitlementLen)
	}
	return e.balanceOp(ctx, ent, subject, time.Now(), func(ctx context.Context, gs grantStore, key string, sp calendar.Span) (bucket.Balance, error) {
		b, err := gs.VoidGrant(ctx, key, id, sp)
		if errors.Is(err, bucket.ErrGrantUnknown) {
			return b, fmt.Errorf("grant %q of %s %s: %w", id, entitlement, subject, rules.ErrNotFound)
		}
		return b, err
	})
}

// Balance returns subject's balance of entitlement, as the next check would see it. An
// unknown entitlement is rules.ErrNotFound; with the store unreachable it fails with
// ErrUnavailable.
func (e *Engine) Balance(ctx context.Context, entitlement, subject string) (Balance, error) {
	ent, err := e.entitlement(entitlement, subject)
	if err != nil {
		return Balance{}, err
	}
	return e.balanceOp(ctx, ent, subject, time.Now(), func(ctx context.Context, gs grantStore, key string, sp calendar.Span) (bucket.Balance, error) {
		return gs.ReadBalance(ctx, key, sp)
	})
}

// MaxEntitlementLen bounds the ids of entitlements and grants (the rules' names, 64 bytes):
// a longer one names nothing, and is refused before an error could echo it back.
const MaxEntitlementLen = 64

// entitlement returns the entitlement named in force, for a subject that may hold it.
func (e *Engine) entitlement(id, subject string) (*rules.Entitlement, error) {
	set := e.rules.Load()
	if set == nil {
		return nil, ErrNoRules
	}
	if id == "" || len(id) > MaxEntitlementLen {
		return nil, field.Errorf("entitlement", "want an entitlement's id, 1 to %d bytes", MaxEntitlementLen)
	}
	ent, ok := set.Entitlement(id)
	switch {
	case !ok:
		return nil, fmt.Errorf("entitlement %q: %w", id, rules.ErrNotFound)
	case subject == "" || len(subject) > rules.MaxIdentifierLen || !utf8.ValidString(subject):
		return nil, field.Errorf("subject", "required: 1 to %d bytes of valid UTF-8", rules.MaxIdentifierLen)
	}
	return ent, nil
}

// balanceOp runs op on subject's balance of ent, in the periods around now, and answers its
// balance.
func (e *Engine) balanceOp(ctx context.Context, ent *rules.Entitlement, subject string, now time.Time,
	op func(context.Context, grantStore, string, calendar.Span) (bucket.Balance, error)) (Balance, error) {
	gs, ok := e.guard.store.(grantStore)
	if !ok {
		return Balance{}, fmt.Errorf("%w: this store holds no balances", ErrUnavailable)
	}
	sp := ent.Period.Around(now)
	cctx, cancel := context.WithTimeout(ctx, e.guard.timeout)
	defer cancel()
	b, err := op(cctx, gs, balanceKey(ent, holderOf(ent, subject)), sp)
	var fe *field.Error
	switch {
	case errors.As(err, &fe), errors.Is(err, rules.ErrExists), errors.Is(err, rules.ErrNotFound):
		return Balance{}, err
	case err != nil && callerGone(ctx):
		// The caller gave up: no outage. Its deadline may have passed with ctx.Err still nil,
		// the socket's deadline (set from ctx) having fired before ctx's own timer.
		return Balance{}, fmt.Errorf("balance of %s %s: %w", ent.ID, subject, callerErr(ctx))
	case err != nil:
		return Balance{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return balanceOf(ent, subject, b, sp), nil
}

// balanceOf is the store's balance in the engine's terms.
func balanceOf(ent *rules.Entitlement, subject string, b bucket.Balance, sp calendar.Span) Balance {
	dim := ent.Key
	if dim == "" {
		dim = ent.Dimension.String()
	}
	end := sp.Start.Add(sp.First)
	if !b.Period.Before(end) {
		end = end.Add(sp.Second)
	}
	out := Balance{Entitlement: ent.ID, Dimension: dim, Subject: subject, PeriodStart: b.Period.In(end.Location()), PeriodEnd: end,
		Used: b.Used, Overage: b.Overage, Remaining: b.Remaining()}
	for _, g := range b.Grants {
		var meta grantMeta
		_ = json.Unmarshal([]byte(g.Meta), &meta) // a rollover keeps none
		rg := rules.Grant{ID: g.ID, Entitlement: ent.ID, Dimension: dim, Subject: subject, Amount: g.Amount,
			Priority: int(g.Priority), EffectiveAt: g.Effective, ExpiresAt: g.Expires, Recurring: g.Recurring,
			Reason: meta.Reason, Creator: meta.Creator, CreatedAt: g.Created, VoidedAt: g.Voided}
		if g.RolloverMax > 0 {
			rg.Rollover = &rules.Rollover{Min: g.RolloverMin, Max: g.RolloverMax}
		}
		out.Grants = append(out.Grants, GrantBalance{Grant: rg, Remaining: g.Remaining, Live: g.Live, IssuedFor: g.IssuedFor})
	}
	return out
}
