package checker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// reservationStore is what reservations need of the store: *bucket.Store's records of
// charges settled later.
type reservationStore interface {
	Mark(ctx context.Context, ttl time.Duration, marks []bucket.Mark) error
	Settle(ctx context.Context, keys []string, actual int64, journal string) (bucket.Settled, error)
}

var _ reservationStore = (*bucket.Store)(nil)

// Reservation bounds.
const (
	// DefaultReservationTTL is how long a reservation waits for its settle when the query
	// names no TTL.
	DefaultReservationTTL = 5 * time.Minute
	// MaxReservationTTL bounds a reservation's TTL: its estimate holds the quota meanwhile.
	MaxReservationTTL = 24 * time.Hour
	// maxReservationParts bounds the slots an ID names (one per subject of the check with
	// limits): each costs Settle a Redis call, so a forged ID must not name many.
	maxReservationParts = 16
	// maxReservationID bounds an ID, so that a forged one costs no more to refuse.
	maxReservationID = 4096
)

// Reservation is what an allowed check with Query.Reserve holds: its cost (the estimate)
// charged to every limit until Settle or Cancel charges or refunds the difference to the
// actual cost, or until ExpiresAt, after which the estimate stands (an expired reservation is
// settled at its estimate). Concurrency limits have no part in it: their place is a Hold.
type Reservation struct {
	// ID names the reservation for Settle and Cancel: a random name, the slots of its records
	// and a MAC binding them to the caller it was issued to (idsign.go), which alone may use
	// it.
	ID        string
	ExpiresAt time.Time
	Estimate  int64
}

// Settlement is what Settle or Cancel did.
type Settlement struct {
	// ID is the settle's decision id in the decision stream.
	ID string
	// ReservationID is the settled reservation's.
	ReservationID string
	Estimate      int64
	Actual        int64
	// Cancelled is set for Cancel (a settle at 0).
	Cancelled bool
	// Overage is set when Actual exceeded Estimate and the difference did not fit a limit: it
	// was charged all the same (the work is done), past that limit.
	Overage bool
	// Remaining is the least any settled limit has left after the settle.
	Remaining int64
	// Now is the store's clock at the settle.
	Now time.Time
	// Tier, Endpoint and RuleID are the reservation's check's (its tier, endpoint and deciding
	// rule), so that the settle's event is counted with it in the rollups.
	Tier, Endpoint, RuleID string
}

// reservationLabel is what a reservation's records keep of its check for the settle's event:
// its tier, endpoint and deciding rule, base64url (bucket.Mark's label), at most 512 bytes.
func reservationLabel(tier, endpoint, rule string) string {
	l := base64.RawURLEncoding.EncodeToString([]byte(tier + "\n" + endpoint + "\n" + rule))
	if len(l) > 512 {
		return "" // an endpoint too long to keep: the settle's event goes without
	}
	return l
}

// parseReservationLabel decodes reservationLabel's; empty strings for a label it did not make.
func parseReservationLabel(l string) (tier, endpoint, rule string) {
	raw, err := base64.RawURLEncoding.DecodeString(l)
	if err != nil {
		return "", "", ""
	}
	f := strings.SplitN(string(raw), "\n", 3)
	if len(f) != 3 {
		return "", "", ""
	}
	return f[0], f[1], f[2]
}

// The outcomes of Settle and Cancel that are the caller's, not the store's.
var (
	// ErrReservationUnknown is an ID with no reservation left: never made, or expired, when its
	// estimate stands.
	ErrReservationUnknown = errors.New("reservation unknown: never made, or expired (its estimate stands)")
	// ErrReservationSettled is a reservation settled or cancelled before: nothing changes, so a
	// retried settle never charges twice.
	ErrReservationSettled = errors.New("reservation already settled or cancelled")
)

// reservationName draws a reservation's name as a holder's is drawn: 128 random bits, which
// only the reserving caller learns.
func reservationName() string { return newHolder() }

// reservationKey is the key of a reservation's record in the slot of tag: "rl:{tag}:rsv:name".
// No bucket key has "rsv" for an algorithm code.
func reservationKey(tag, name string) string {
	return "rl:" + tag + ":rsv:" + name
}

// keyTag returns the hash tag "{…}" of a bucket key "rl:{…}:…" (subjectTag escapes every "}"
// of an identifier, so the first one ends it), "" for any other.
func keyTag(key string) string {
	rest, ok := strings.CutPrefix(key, "rl:")
	if !ok || !strings.HasPrefix(rest, "{") {
		return ""
	}
	i := strings.IndexByte(rest, '}')
	if i < 0 {
		return ""
	}
	return rest[:i+1]
}

// reservationID encodes a name, the expiry and the tags of the records: "<name>.<expiry unix
// ms>.<base64url of the tags, one per line>".
func reservationID(name string, expires time.Time, tags []string) string {
	return name + "." + strconv.FormatInt(expires.UnixMilli(), 10) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(strings.Join(tags, "\n")))
}

// parseReservationID decodes an ID's body (its MAC verified and cut off, its size checked by
// settle) into its records' keys and expiry.
func parseReservationID(id string) (keys []string, expires time.Time, err error) {
	bad := func(why string) error { return field.Errorf("reservation_id", "not a reservation id: %s", why) }
	f := strings.Split(id, ".")
	if len(f) != 3 || f[0] == "" {
		return nil, time.Time{}, bad("want name.expiry.slots")
	}
	ms, perr := strconv.ParseInt(f[1], 10, 64)
	raw, derr := base64.RawURLEncoding.DecodeString(f[2])
	if perr != nil || derr != nil || len(raw) == 0 {
		return nil, time.Time{}, bad("malformed expiry or slots")
	}
	for tag := range strings.SplitSeq(string(raw), "\n") {
		if len(tag) < 3 || tag[0] != '{' || strings.IndexByte(tag, '}') != len(tag)-1 {
			return nil, time.Time{}, bad("a slot that is no subject's")
		}
		if len(keys) == maxReservationParts {
			return nil, time.Time{}, bad(fmt.Sprintf("more than %d slots", maxReservationParts))
		}
		keys = append(keys, reservationKey(tag, f[0]))
	}
	return keys, time.UnixMilli(ms), nil
}

// reserve records the charges of an allowed check with Query.Reserve (decide's results): one
// record per request that charged a limit a settle changes, and sets out.Reservation. A failure
// to record is ErrUnavailable and sets none: the estimate stays charged, never settled.
func (e *Engine) reserve(ctx context.Context, q *Query, pl plan, results []bucket.Result, out *Outcome) error {
	rs, ok := e.guard.store.(reservationStore)
	if !ok {
		return fmt.Errorf("%w: this store keeps no reservations", ErrUnavailable)
	}
	name := reservationName()
	var rule string
	if d := out.DecidingLimit(); d != nil {
		rule = d.Rule.ID
	}
	label := reservationLabel(out.Tier, q.Endpoint, rule)
	var marks []bucket.Mark
	var tags []string
	for i := range pl.reqs {
		req, res := &pl.reqs[i], &results[i]
		if req.Peek || !res.Allowed || res.Refunded || !bucket.Marked(req) {
			continue
		}
		tag := keyTag(req.Limits[0].Key)
		marks = append(marks, bucket.Mark{Key: reservationKey(tag, name), Request: req, Result: res, Label: label})
		tags = append(tags, tag)
	}
	if len(marks) == 0 {
		return nil // nothing to settle: no limit, or only concurrency ones
	}
	expires := out.Now.Add(q.Reserve)
	id, err := e.ids.sign(ctx, idKindReservation, reservationID(name, expires, tags))
	if err != nil {
		return err
	}
	if err := rs.Mark(ctx, q.Reserve, marks); err != nil {
		return fmt.Errorf("%w: record the reservation: %w", ErrUnavailable, err)
	}
	out.Reservation = &Reservation{ID: id, ExpiresAt: expires, Estimate: q.Cost}
	return nil
}

// Settle settles a reservation (Reservation.ID) at its actual cost: every limit it charged is
// charged actual - estimate more (past the limit if need be: the work is done; the Settlement
// says Overage), or refunded estimate - actual, each slot atomically and at most once. The
// settle is published as a decision. Errors: a FieldError naming reservation_id or actual;
// errors naming reservation_id and wrapping ErrReservationUnknown (never made, or expired: its
// estimate stands) or ErrReservationSettled (settled or cancelled before: nothing changes);
// ErrUnavailable (the store could not answer:
// the outcome is unknown, and a retry settles what is left, never twice).
func (e *Engine) Settle(ctx context.Context, id string, actual int64) (*Settlement, error) {
	if actual < 0 || actual > MaxCost {
		return nil, field.Errorf("actual", "%d is not a cost: want 0 to %d", actual, int64(MaxCost))
	}
	return e.settle(ctx, id, actual, false)
}

// Cancel refunds a reservation's whole estimate: a settle at 0, with Settle's errors.
func (e *Engine) Cancel(ctx context.Context, id string) (*Settlement, error) {
	return e.settle(ctx, id, 0, true)
}

func (e *Engine) settle(ctx context.Context, id string, actual int64, cancel bool) (*Settlement, error) {
	if id == "" {
		return nil, field.Errorf("reservation_id", "required")
	}
	if len(id) > maxReservationID {
		return nil, field.Errorf("reservation_id", "not a reservation id: longer than %d bytes", maxReservationID)
	}
	body, err := e.ids.verify(ctx, idKindReservation, "reservation_id", id)
	if err != nil {
		return nil, err
	}
	keys, expires, err := parseReservationID(body)
	if err != nil {
		return nil, err
	}
	rs, ok := e.guard.store.(reservationStore)
	if !ok {
		return nil, fmt.Errorf("%w: this store keeps no reservations", ErrUnavailable)
	}
	// The settle's decision id comes first: a balance's moves are journaled under it.
	sid, journal := e.nextDecisionID(), ""
	if e.journal != nil {
		journal = bucket.JournalArg(sid, "")
	}
	got, err := rs.Settle(ctx, keys, actual, journal)
	switch {
	case errors.Is(err, bucket.ErrUnknownReservation):
		if time.Now().After(expires) {
			return nil, fmt.Errorf("reservation_id: %w: it expired at %s", ErrReservationUnknown, expires.UTC().Format(time.RFC3339))
		}
		return nil, fmt.Errorf("reservation_id: %w", ErrReservationUnknown)
	case errors.Is(err, bucket.ErrSettled):
		return nil, fmt.Errorf("reservation_id: %w", ErrReservationSettled)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if e.olc != nil && actual < got.Estimate {
		e.olc.forget(got.Keys) // capacity came back: a cached denial may no longer hold
	}
	s := &Settlement{ReservationID: id, Estimate: got.Estimate, Actual: actual, Cancelled: cancel,
		Overage: got.Over, Now: got.Now, Remaining: -1}
	s.Tier, s.Endpoint, s.RuleID = parseReservationLabel(got.Label)
	for _, l := range got.Limits {
		if s.Remaining < 0 || l.Remaining < s.Remaining {
			s.Remaining = l.Remaining
		}
	}
	s.ID = sid
	// The settle's cost is what it charged: actual - estimate, below 0 a refund.
	durable := e.publishEvent(ctx, &Query{Endpoint: s.Endpoint, Cost: s.Actual - s.Estimate},
		&Outcome{Allowed: true, Now: s.Now, ID: s.ID, Decider: -1, Tier: s.Tier, Settlement: s, Limits: e.settledBalances(got)},
		tagSubject(keyTag(keys[0])))
	if durable && journal != "" {
		for _, key := range got.Keys {
			if strings.Contains(key, ":bl:") {
				e.journal.drop(bucket.JournalRef{Key: key, ID: sid})
			}
		}
	}
	return s, nil
}

// settledBalances are the balances a settle moved, as limits of its event, whose moves the
// grant ledger counts (what the settle burned past the estimate or gave back below it). A
// balance of an entitlement no longer declared is left out.
func (e *Engine) settledBalances(got bucket.Settled) []LimitOutcome {
	set := e.rules.Load()
	var out []LimitOutcome
	for i, key := range got.Keys {
		lr := got.Limits[i]
		head, id, ok := strings.Cut(key, ":bl:")
		if !ok || len(lr.Moves()) == 0 || set == nil {
			continue
		}
		ent, ok := set.Entitlement(id)
		if !ok {
			continue
		}
		sub := tagSubject(keyTag(head))
		if id, err := url.PathUnescape(sub.ID); err == nil {
			sub.ID = id // as the holder's checks name it, not as its key escapes it
		}
		lr.Allowed = true // a settle denies nothing: Settlement.Overage says what did not fit
		lim := balanceLimit(ent, sub, got.Now)
		lim.Key = key
		out = append(out, LimitOutcome{Rule: ent.Rule(), Subject: sub, Limit: balanceView(&lim, lr), Result: lr, thresholds: ent.Warning()})
	}
	return out
}

// tagSubject is the subject of a hash tag "{dim:id}" (the identifier as escaped in keys), for
// the events of a settle, which knows its reservation by its slots only.
func tagSubject(tag string) Subject {
	dim, id, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(tag, "{"), "}"), ":")
	d, err := rules.ParseDimension(dim)
	if err != nil {
		return Subject{}
	}
	if d == rules.DimensionGlobal {
		return globalSubject
	}
	return Subject{Dimension: d, ID: id}
}

// publishEvent hands the sink an event that decides nothing (a settle, a cancel, a lease's
// release): out holds its own field, q what the event charged (and where), to which publishEvent
// adds its subject (the first of the buckets it touched).
// It reports whether the event is durable (Engine.publish).
func (e *Engine) publishEvent(ctx context.Context, q *Query, out *Outcome, sub Subject) bool {
	if sub.Dimension.Valid() {
		q.Subjects = []Subject{sub}
	}
	return e.publish(ctx, q, out)
}
