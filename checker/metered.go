package checker

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
)

// UsageRecordTTL is how long RecordUsage remembers an event id: a second record of the id
// within it burns nothing. An hour covers a sender's retries and a consumer's restart; each
// remembered id costs Redis about 190 bytes (BenchmarkUsageRecordMemory), so a longer memory is paid
// per event.
const UsageRecordTTL = time.Hour

// MaxEventIDLen bounds a usage's event id, as an idempotency key is bounded.
const MaxEventIDLen = MaxIdempotentLen

// MeteredUsage is usage measured outside a check (the tokens of a response, counted after it)
// that burns a balance: RecordUsage's argument.
type MeteredUsage struct {
	Entitlement string
	// Subject is the holder: a user's, API key's or org's id, or a custom dimension's value.
	Subject string
	// Amount is what was used, 1 to rules.MaxAmount.
	Amount int64
	// EventID is the caller's id of the usage, as a CloudEvent's id: a second record of one id
	// (within UsageRecordTTL) burns nothing and answers the first. 1 to MaxEventIDLen bytes.
	EventID string
	// Endpoint is what the usage was of, for the audit; empty: "/".
	Endpoint string
}

// Recorded is what RecordUsage did.
type Recorded struct {
	// DecisionID is the id of the decision event that audits the usage.
	DecisionID string
	// Replayed: the event id was recorded before; nothing was burned now, and Taken and
	// Excess are the first record's.
	Replayed bool
	// Taken is what the grants gave; the rest of the amount is overage.
	Taken int64
	// Excess is the part of the overage past what the entitlement lets past zero (all of the
	// overage of a hard one; past the cap of a soft one): usage the balance did not cover, which
	// the ledger holds and checks answer with denials until grants come.
	Excess  int64
	Balance Balance
}

// RecordUsage burns u's amount from its subject's balance, as a check would but without a
// denial (the usage happened): the live grants in burn order, then overage, past a hard
// balance or a soft one's cap too (Recorded.Excess). It is audited as a check is: a decision,
// allowed unless there was an excess, goes to the DecisionSink. A bad field is a
// *field.Error; an unknown entitlement rules.ErrNotFound; with the store unreachable it fails
// with ErrUnavailable (no fail mode: nothing was burned, and the caller's retry with the same
// event id burns once).
func (e *Engine) RecordUsage(ctx context.Context, u MeteredUsage) (Recorded, error) {
	start := time.Now()
	q, ent, err := e.usageQuery(u)
	if err != nil {
		return Recorded{}, err
	}
	sub := holderOf(ent, u.Subject)
	key := balanceKey(ent, sub)
	lim := balanceLimit(ent, sub, time.Now())
	// The decision's id comes first: the burn is journaled under it (journal.go).
	id := e.nextDecisionID()
	if e.journal != nil {
		lim.Journal = journalArg(id, sub)
	}
	var use bucket.Use
	b, err := e.balanceOp(ctx, ent, u.Subject, time.Now(), func(ctx context.Context, gs grantStore, key string, sp calendar.Span) (bucket.Balance, error) {
		lim.Periods = sp
		var err error
		use, err = gs.UseBalance(ctx, key, usageRecordKey(key, u.EventID), lim, u.Amount, UsageRecordTTL)
		return use.Balance, err
	})
	if err != nil {
		return Recorded{}, err
	}
	set := e.rules.Load()
	out := &Outcome{Allowed: use.Excess == 0, Replayed: use.Replayed, Now: use.Balance.Now, Decider: 0, ID: id}
	_ = resolveTier(set, q, out)
	res := LimitResult{Allowed: out.Allowed, Used: b.Used, Remaining: b.Remaining, ResetAt: b.PeriodEnd,
		Balance: &bucket.BalanceChange{Told: use.Told, Moves: use.Moves}}
	lim.Key = key
	out.Limits = []LimitOutcome{{Rule: ent.Rule(), Subject: sub, Limit: balanceView(&lim, res), Result: res, thresholds: ent.Warning()}}
	out = e.record(ctx, q, out, false, start)
	return Recorded{DecisionID: out.ID, Replayed: use.Replayed, Taken: use.Taken, Excess: use.Excess, Balance: b}, nil
}

// usageQuery validates u and returns the query that audits it, and its entitlement.
func (e *Engine) usageQuery(u MeteredUsage) (*Query, *rules.Entitlement, error) {
	ent, err := e.entitlement(u.Entitlement, u.Subject)
	if err != nil {
		return nil, nil, err
	}
	if u.Amount < 1 || u.Amount > rules.MaxAmount {
		return nil, nil, field.Errorf("amount", "want a whole number from 1 to %d, got %d", int64(rules.MaxAmount), u.Amount)
	}
	if err := field.Text(u.EventID, MaxEventIDLen); err != nil {
		return nil, nil, field.Wrap("event_id", err)
	}
	ep := u.Endpoint
	if ep == "" {
		ep = "/"
	}
	if ep, err = field.Endpoint(ep, MaxEndpointLen); err != nil {
		return nil, nil, field.Wrap("endpoint", err)
	}
	sub := holderOf(ent, u.Subject)
	q := &Query{Subjects: []Subject{sub}, Endpoint: ep, Cost: u.Amount, Entitlement: ent.ID, IdempotencyKey: u.EventID}
	if sub.Dimension == rules.DimensionOrg {
		q.Subjects = nil // an org is no subject a check names; the decision reports it in its limit
	}
	return q, ent, nil
}

// usageRecordKey is the key of the record of event id's usage of the balance at key: in its
// slot, named by a hash of the id, so that an id of any bytes makes a key of one length.
func usageRecordKey(key, id string) string {
	sum := sha256.Sum256([]byte(id))
	return key + "#use:" + base64.RawURLEncoding.EncodeToString(sum[:16])
}
