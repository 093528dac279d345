package checker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/field"
)

// holdStore is what Release and Renew need of the store: *bucket.Store's places held in flight.
type holdStore interface {
	Release(ctx context.Context, key, holder string) (time.Time, error)
	Renew(ctx context.Context, key, holder string, ttl time.Duration) (time.Time, error)
}

var _ holdStore = (*bucket.Store)(nil)

// Lease is what an allowed check holds of its concurrency limits (rules of algorithm
// concurrency): a place in flight in each, until Release, or until ExpiresAt when never
// released or renewed, so that a client that crashes leaks nothing: the API's concurrency
// lease (ReleaseLease, RenewLease). A checker's slice of a global budget is an allotment
// (allotment.go), another thing.
type Lease struct {
	// ID names the lease for Release and Renew: a random holder, the buckets it holds places in
	// with their TTLs, and a MAC binding them to the caller it was issued to (idsign.go), which
	// alone may use it.
	ID string
	// ExpiresAt is when the first of its places frees itself.
	ExpiresAt time.Time
}

// The outcomes of Release and Renew that are the caller's, not the store's.
var (
	// ErrLeaseNotHeld is an ID that holds nothing: never granted, already released, or expired
	// and since taken by another check. A second Release of one ID is this, never a second
	// free.
	ErrLeaseNotHeld = errors.New("lease not held: unknown, or already released")
	// ErrLeaseExpired is a lease whose places freed themselves at their expiry: another check may
	// have them now, so it cannot be renewed.
	ErrLeaseExpired = errors.New("lease expired: its places freed themselves")
)

// maxHoldID bounds an ID (holder, TTLs and keys), so that a forged one costs no more to refuse.
const maxHoldID = 4096

// maxHoldPlaces bounds the places an ID names: each costs Release and Renew a Redis call, so an
// ID forged with many would make one request cost Redis many. A check holds one place per
// concurrency rule of its subjects, far fewer.
const maxHoldPlaces = 16

// holdPlace is one bucket a lease holds a place in, and the place's TTL (the rule's window).
type holdPlace struct {
	key string
	ttl time.Duration
}

// minTTL is the shortest TTL of places: when the first of them frees itself.
func minTTL(places []holdPlace) time.Duration {
	m := places[0].ttl
	for _, p := range places[1:] {
		m = min(m, p.ttl)
	}
	return m
}

// newHolder draws a holder: 128 random bits, base64url.
func newHolder() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// leaseID encodes a holder and its places: "<holder>.<base64url of one "<ttl_ms> <key>" line per
// place>".
func leaseID(holder string, places []holdPlace) string {
	var b strings.Builder
	for i, p := range places {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(strconv.FormatInt(p.ttl.Milliseconds(), 10))
		b.WriteByte(' ')
		b.WriteString(p.key)
	}
	return holder + "." + base64.RawURLEncoding.EncodeToString([]byte(b.String()))
}

// parseLeaseID decodes an ID's body (its MAC verified and cut off, its size checked by lease),
// refusing any that does not name concurrency buckets.
func parseLeaseID(id string) (holder string, places []holdPlace, err error) {
	bad := func(why string) error { return field.Errorf("lease_id", "not a lease id: %s", why) }
	holder, enc, ok := strings.Cut(id, ".")
	if !ok || holder == "" || len(holder) > bucket.MaxHolder {
		return "", nil, bad("no holder")
	}
	raw, derr := base64.RawURLEncoding.DecodeString(enc)
	if derr != nil || len(raw) == 0 {
		return "", nil, bad("no places")
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		ms, key, ok := strings.Cut(line, " ")
		n, perr := strconv.ParseInt(ms, 10, 64)
		if !ok || perr != nil || n < 1 || n > int64(rules.MaxHoldTTL/time.Millisecond) || !isConcurrencyKey(key) {
			return "", nil, bad("a place that is no concurrency bucket")
		}
		if len(places) == maxHoldPlaces {
			return "", nil, bad(fmt.Sprintf("more than %d places", maxHoldPlaces))
		}
		places = append(places, holdPlace{key: key, ttl: time.Duration(n) * time.Millisecond})
	}
	return holder, places, nil
}

// isConcurrencyKey reports whether key is a concurrency bucket's, "rl:{tag}:cc:…" (keyTag).
func isConcurrencyKey(key string) bool {
	tag := keyTag(key)
	return tag != "" && strings.HasPrefix(key[len("rl:")+len(tag):], ":"+algorithm.Concurrency.Code()+":")
}

// Release frees the places a check's lease holds (Lease.ID), so that other checks may take them at
// once. A malformed ID is a FieldError naming lease_id; one that holds nothing is an error
// wrapping ErrLeaseNotHeld (a second release of one ID too: never a second free), one whose
// places had freed themselves ErrLeaseExpired, both naming lease_id; with the store
// unreachable, ErrUnavailable: the places then free themselves at their expiry.
func (e *Engine) Release(ctx context.Context, id string) error {
	_, err := e.lease(ctx, id, false)
	return err
}

// Renew extends a lease's places by their TTLs from now and returns the new expiry of the first;
// errors as Release's.
func (e *Engine) Renew(ctx context.Context, id string) (time.Time, error) {
	return e.lease(ctx, id, true)
}

func (e *Engine) lease(ctx context.Context, id string, renew bool) (time.Time, error) {
	if id == "" {
		return time.Time{}, field.Errorf("lease_id", "required")
	}
	if len(id) > maxHoldID {
		return time.Time{}, field.Errorf("lease_id", "not a lease id: longer than %d bytes", maxHoldID)
	}
	body, err := e.ids.verify(ctx, idKindLease, "lease_id", id)
	if err != nil {
		return time.Time{}, err
	}
	holder, places, err := parseLeaseID(body)
	if err != nil {
		return time.Time{}, err
	}
	hs, ok := e.guard.store.(holdStore)
	if !ok {
		return time.Time{}, fmt.Errorf("%w: this store holds no places", ErrUnavailable)
	}
	var first time.Time
	held, expired := 0, 0
	for _, p := range places {
		var at time.Time
		if renew {
			at, err = hs.Renew(ctx, p.key, holder, p.ttl)
		} else {
			at, err = hs.Release(ctx, p.key, holder)
		}
		switch {
		case errors.Is(err, bucket.ErrNotHeld):
		case errors.Is(err, bucket.ErrExpired):
			expired++
		case err != nil:
			return time.Time{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		default:
			held++
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
	}
	sub := tagSubject(keyTag(places[0].key))
	switch {
	case held == 0 && expired > 0:
		e.publishEvent(ctx, &Query{}, &Outcome{Allowed: true, Now: time.Now(), ID: e.nextDecisionID(), Decider: -1,
			Released: &Released{LeaseID: id, Expired: true}}, sub)
		return time.Time{}, fmt.Errorf("lease_id: %w", ErrLeaseExpired)
	case held == 0:
		return time.Time{}, fmt.Errorf("lease_id: %w", ErrLeaseNotHeld)
	case !renew:
		e.publishEvent(ctx, &Query{}, &Outcome{Allowed: true, Now: time.Now(), ID: e.nextDecisionID(), Decider: -1,
			Released: &Released{LeaseID: id}}, sub)
	}
	return first, nil
}

// Released is a lease's release, or its expiry found by a release or renewal, as the decision
// stream records it.
type Released struct {
	LeaseID string
	// Expired is set when its places had freed themselves at their expiry.
	Expired bool
}
