// Package bucket evaluates rate limits. Store keeps buckets in Redis and updates every limit of
// one subject atomically in one Lua script call, on Redis time; Local keeps the same algorithms
// in process, for the rules whose fail mode is "local" while Redis cannot be reached.
package bucket

import (
	"math"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
)

// Limit is one limit of one subject.
type Limit struct {
	// Key is the Redis key of the bucket. All keys of one Request share one hash tag, so they
	// live in one Redis Cluster slot.
	Key       string
	Algorithm algorithm.ID
	// Limit is the number of units allowed per Window.
	Limit  int64
	Window time.Duration
	// Burst is the capacity of token bucket, leaky bucket and algorithm.GCRA; 0 means Limit. Window
	// algorithms ignore it.
	Burst int64
	// MaxDelay, for algorithm.GCRA and algorithm.LeakyBucket, makes the limit a queue (a leaky bucket used as
	// one): a charge the limit would deny is allowed after a delay instead, when that delay is
	// at most MaxDelay, and charged at the slot it is given, so that the delayed charges are
	// spaced exactly Window/Limit apart (per unit of cost). A charge whose delay would exceed
	// MaxDelay is denied. LimitResult.Delay is the delay. 0: no queue.
	MaxDelay time.Duration
	// Holder is, for algorithm.Concurrency, who holds the place a charge takes in flight (the id of a
	// concurrency lease, in the API's words; no relation to Store.Lease's budget slices): drawn
	// at random by the caller, which proves itself its holder by knowing it (Store.Release,
	// Store.Renew), 1 to MaxHolder bytes. The other algorithms ignore it.
	Holder string
	// Periods are, for algorithm.CalendarWindow and algorithm.Balance, two consecutive calendar
	// periods around the caller's clock (calendar.Period.Around): the decision is made in the
	// one that holds Redis's time, and Window is only the unit's nominal length. Other
	// algorithms ignore them. A balance's Limit is 1 + its overage cap (1: none).
	Periods calendar.Span
	// Thresholds are, for algorithm.Balance, the crossings a charge tells once each
	// (BalanceChange.Told), as ThresholdSpec writes them; empty for none.
	Thresholds string
	// Journal is, for algorithm.Balance, where a charge journals what it did (JournalArg: the
	// id of the decision that will report it, and its holder), so that a decision lost after
	// Redis charged is published again (journal.go); empty: not journaled.
	Journal string
	// OverageCap bounds what a settle charges this limit past its reservation's estimate
	// (Store.Settle); 0 means no bound.
	OverageCap int64
	// Pooled marks a bucket many callers share (a global, org, IP or custom dimension's): a
	// settle charges it an overage only as far as it fits now and at most the estimate again,
	// so that one caller's overage cannot deny the others. A caller's own bucket (a user's, an
	// API key's) is charged the whole overage, past its limit: a debt only it waits out.
	Pooled bool
}

// overageBound is what a settle may charge l past an estimate: -1 for no bound.
func (l *Limit) overageBound(estimate int64) int64 {
	bound := l.OverageCap
	if bound <= 0 {
		bound = -1
	}
	if l.Pooled && (bound < 0 || estimate < bound) {
		bound = max(estimate, 0)
	}
	return bound
}

// Capacity is the most a single check may consume: Burst for the algorithms that have one
// (Limit when Burst is 0), Limit for window algorithms.
func (l Limit) Capacity() int64 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// Request is one subject's check: every limit is evaluated and, unless Peek, Cost is consumed
// from all of them only if all of them allow.
type Request struct {
	Limits []Limit
	// Cost is the number of units consumed; it must be at least 1.
	Cost int64
	// Peek evaluates without consuming (GetRemainingQuota).
	Peek bool
	// Shadow marks a request whose limits are only observed: its denial does not deny the
	// check (no other request is refunded because of it), but it is refunded like any other
	// when an enforced request of the same check denies.
	Shadow bool
	// Replaces, on a Shadow request, is the Key of the one enforced limit of the call that it
	// stands in for (a candidate rule's live limit): the request is decided as if it had
	// replaced that limit, so that limit's denial does not refund it, while the denial of any
	// other enforced limit does (Kept). Empty for none.
	Replaces string
	// IdempotencyKey is the Redis key of the idempotency record of the whole Check call, in
	// the same slot as Limits; empty for none. At most one request of a call has one (the call
	// is one checked request, which has one record): see Store.Check. The record exists only
	// for an allowed call, for IdempotencyTTL; a retry then charges nothing and is answered
	// Replayed and allowed. A denied call leaves none: nothing of it stayed charged, so its
	// retry is decided afresh. Peek ignores it, and a refund of the charge that wrote it
	// deletes it.
	IdempotencyKey string
	// Fingerprint identifies what the checked request asks (the caller decides what that
	// covers), and binds the idempotency record to it: a record replays only for the
	// fingerprint that wrote it, and for any other the check fails with
	// ErrIdempotencyConflict, charging nothing, so that one key cannot pass different requests
	// uncharged. It is stored as given: a short one (checker's is 16 bytes) keeps the record
	// small. Ignored without IdempotencyKey.
	Fingerprint string
	// Count charges every limit whether it allows or not, as Envoy's reference service
	// counts the hits over a limit (its INCRBY comes before the comparison): a denied Count
	// request stays charged, and the next check sees the count past the limit. Only fixed
	// window limits may be counted, and a counted request carries no idempotency record.
	Count bool
}

// IdempotencyTTL is how long an idempotency record is kept.
const IdempotencyTTL = 5 * time.Minute

// Result is the outcome of one Request.
type Result struct {
	// Allowed is true when every limit allowed.
	Allowed bool
	// Replayed is true when the call's idempotency record said it was decided before: nothing
	// stays charged. Allowed and each limit's Allowed then give the first decision (allowed;
	// Shadow requests excepted, which report what they would decide now), and the counters
	// the state now, as a peek reports it.
	Replayed bool
	// Refunded is true when the subject was charged but another subject of the same check
	// denied, so the charge was given back. Allowed and Limits then describe the state after
	// the refund, as a Peek would: whether Cost would fit now.
	Refunded bool
	// Now is the time the decision was made: Redis TIME for Store, the given time for Local.
	Now time.Time
	// Limits has one entry per Request.Limits entry, in the same order.
	Limits []LimitResult

	// refund holds, per limit, what the refund script needs to undo the charge exactly.
	refund []string
}

// LimitResult is the outcome of one Limit.
type LimitResult struct {
	Allowed bool
	// Used is how much of the capacity is used after the check (rounded up).
	Used int64
	// Remaining is how much could still be consumed now (rounded down).
	Remaining int64
	// ResetAt is when the bucket is fully available again.
	ResetAt time.Time
	// RetryAfter is, when denied, how long until Cost would be allowed by this limit; 0 when
	// allowed. It is never 0 when denied.
	RetryAfter time.Duration
	// Balance is, for a charge (or settle) of a balance, what it told and what it did to the
	// grants (BalanceChange); nil for other limits, and for a balance's peek or denial. A
	// pointer, so that the results of the other limits, copied along a check's path, carry
	// one word for it.
	Balance *BalanceChange
	// Delay is, for an allowed charge of a limit with a MaxDelay, how long the caller must
	// wait before going on: the charge holds the slot at the decision's time plus Delay, to
	// the µs, never before it (queueDelay). 0 otherwise: not queued, a peek, a replay.
	Delay time.Duration
}

// BalanceChange is what a charge of a balance told and moved.
type BalanceChange struct {
	// Told are the thresholds (Limit.Thresholds) it made true and told first: each is told
	// once per period (a grant's expiry once per grant), by one charge whatever the checkers.
	Told []Told
	// Moves are what it did to the grants (Move): what it burned, and what the start of a
	// new period did, which a refund of the charge keeps; for a settle, what it burned or
	// gave back.
	Moves []Move
}

// Told is r's Balance's Told, nil for none.
func (r *LimitResult) Told() []Told {
	if r.Balance == nil {
		return nil
	}
	return r.Balance.Told
}

// Moves is r's Balance's Moves, nil for none.
func (r *LimitResult) Moves() []Move {
	if r.Balance == nil {
		return nil
	}
	return r.Balance.Moves
}

// change is the BalanceChange of told and moves, nil when both are empty.
func change(told []Told, moves []Move) *BalanceChange {
	if len(told) == 0 && len(moves) == 0 {
		return nil
	}
	return &BalanceChange{Told: told, Moves: moves}
}

// queueDelay is the delay of an allowed charge of l, a queue, decided at now, whose bucket is
// empty again at reset (the reply's, in whole µs rounded up): how far past the limit's
// capacity the charge was queued, reset - now - capacity * window / limit (lua/gcra.lua,
// lua/leaky_bucket.lua). The rounding of reset makes that up to 1 µs more than the delay; a
// charge that was not queued (less than 1 µs) has none.
func queueDelay(l *Limit, now, reset time.Time) time.Duration {
	if l.MaxDelay <= 0 {
		return 0
	}
	tau := float64(l.Capacity()) * float64(l.windowUS()) / float64(l.Limit)
	x := float64(reset.Sub(now).Microseconds()) - tau
	if x < 1 {
		return 0
	}
	return time.Duration(math.Ceil(x-1e-6)) * time.Microsecond
}
