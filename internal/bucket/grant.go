package bucket

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/redis/go-redis/v9"
)

// A balance (algorithm.Balance) is made of grants that the admin API writes into Redis with
// PutGrant and VoidGrant, and that checks burn in the check script (lua/balance.lua has the
// contract). ReadBalance answers a balance as the next charge would see it.

// grantLua is the driver of PutGrant, VoidGrant and ReadBalance; see grant.lua for its
// contract. Like hold.lua, it lives beside this file, not under lua/, whose files are parts of
// the check script; but it runs the balance module's helpers.
//
//go:embed grant.lua
var grantLua string

// grantSource is the grant script: the prelude and the balance module, built as a check of a
// balance builds them, then grant.lua.
var grantSource = "local BATCH = false\nlocal LIBRARY = false\n" +
	"local NEED_1, NEED, MODE, REFUNDS = '9', nil, '0', false\n" +
	mustRead("prelude.lua") + "\n" + mustRead("balance.lua") + "\n" + grantLua

var grantScript = newScript(grantSource)

// The outcomes of the grant operations that are no error of the store.
var (
	// ErrGrantExists is a PutGrant of an id the balance holds with another definition.
	ErrGrantExists = errors.New("bucket: a grant with that id and another definition exists")
	// ErrGrantUnknown is a VoidGrant of an id the balance does not hold.
	ErrGrantUnknown = errors.New("bucket: no grant with that id")
	// ErrTooManyGrants is a PutGrant into a balance that holds MaxGrants grants.
	ErrTooManyGrants = errors.New("bucket: the balance holds as many grants as it may")
)

// MaxGrants bounds the grants of one balance (lua/grant.lua's MAX_GRANTS): a charge reads them
// all, and their sum stays exact in Lua's doubles when each is at most 2^44.
const MaxGrants = 256

// Grant is one grant of a balance.
type Grant struct {
	ID string
	// Remaining is what it has left; Amount what it gives each period it is issued for.
	Remaining, Amount int64
	// Priority orders the burn: lower first, then the earliest Expires, then the oldest.
	Priority int64
	// Effective is when it starts to count; Expires when it stops (zero: never); Created when
	// it was made; Voided when it was voided (zero: not).
	Effective, Expires, Created, Voided time.Time
	// Recurring grants are issued again for every period; RolloverMin and RolloverMax bound
	// what one carries into the next (both 0: nothing).
	Recurring                bool
	RolloverMin, RolloverMax int64
	// IssuedFor is the start of the period it was last issued for.
	IssuedFor time.Time
	// Live is whether it counts now: started, not expired, not voided, something left.
	Live bool
	// Meta is what the caller keeps with it (at most 4096 bytes; "" for a rollover), in a hash
	// of its own beside the balance's ("<key>#meta"), which charges never read.
	Meta string
}

// Balance is a balance brought to the period that holds Redis's time.
type Balance struct {
	// Period is the period's start; Used what was charged in it, Overage the part of that a
	// soft entitlement let past a zero balance.
	Period        time.Time
	Used, Overage int64
	// Now is Redis's time.
	Now    time.Time
	Grants []Grant
}

// Remaining is the sum of what the live grants have left.
func (b *Balance) Remaining() int64 {
	var sum int64
	for _, g := range b.Grants {
		if g.Live {
			sum += g.Remaining
		}
	}
	return sum
}

// PutGrant makes grant g in the balance at key, issued for the period of periods (the
// entitlement's, as a charge of it sends them) that holds Redis's time, with all its
// Amount left and its Meta kept beside it; its Remaining, Created, Voided, IssuedFor and Live
// are ignored, and a zero
// Effective is Redis's now. Putting the same grant again (a retry) changes nothing;
// ErrGrantExists when the id is another grant's, ErrTooManyGrants past MaxGrants.
func (s *Store) PutGrant(ctx context.Context, key string, g Grant, periods calendar.Span) (Balance, error) {
	var eff, exp int64
	if !g.Effective.IsZero() {
		eff = g.Effective.UnixMilli()
	}
	if !g.Expires.IsZero() {
		exp = g.Expires.UnixMilli()
	}
	rec := "0"
	if g.Recurring {
		rec = "1"
	}
	w, b, err := periodArgs(periods)
	if err != nil || g.ID == "" || g.Amount < 1 || g.Priority < 0 || eff < 0 || exp < 0 || g.RolloverMin < 0 || g.RolloverMax < g.RolloverMin || len(g.Meta) > maxMeta {
		return Balance{}, fmt.Errorf("bucket: put grant %q in %q: %w", g.ID, key, ErrInvalidRequest)
	}
	return s.grant(ctx, key, "put", g.ID, itoa(g.Amount), itoa(g.Priority), itoa(eff), itoa(exp), rec,
		itoa(g.RolloverMin), itoa(g.RolloverMax), w, b, g.Meta)
}

// maxMeta bounds Grant.Meta (grant.lua refuses more).
const maxMeta = 4096

// VoidGrant voids grant id of the balance at key from Redis's now (what it paid for stays
// paid); voiding it again keeps the first instant. ErrGrantUnknown when there is none.
func (s *Store) VoidGrant(ctx context.Context, key, id string, periods calendar.Span) (Balance, error) {
	w, b, err := periodArgs(periods)
	if err != nil || id == "" {
		return Balance{}, fmt.Errorf("bucket: void grant %q in %q: %w", id, key, ErrInvalidRequest)
	}
	return s.grant(ctx, key, "void", id, w, b)
}

// ReadBalance returns the balance at key as the next charge would see it, writing nothing.
func (s *Store) ReadBalance(ctx context.Context, key string, periods calendar.Span) (Balance, error) {
	w, b, err := periodArgs(periods)
	if err != nil {
		return Balance{}, fmt.Errorf("bucket: read balance %q: %w", key, ErrInvalidRequest)
	}
	return s.grant(ctx, key, "read", w, b)
}

// Use is what UseBalance did.
type Use struct {
	// Replayed: the record said the usage was burned before; nothing was burned now, and
	// Taken and Excess are the first burn's.
	Replayed bool
	// Taken is what the grants gave; the rest of the amount went to overage.
	Taken int64
	// Excess is the part of the overage past what the balance lets past zero (all of it for
	// a hard balance; past the cap for a soft one).
	Excess int64
	// Told are the thresholds (Limit.Thresholds) the use told, and Moves what it did to the
	// grants, as a charge's (BalanceChange); nil for a replay.
	Told  []Told
	Moves []Move
	// Balance is the balance after.
	Balance Balance
}

// UseBalance burns amount of usage measured elsewhere from the balance at key (of Limit l, as
// a charge of it sends it: Limit and Periods), once per record (a key in key's slot, kept
// ttl): the live grants in burn order, then overage for the rest, past what l lets past zero
// too, since the usage happened. A record that exists is a retry: nothing is burned, and the
// answer is Replayed with the first burn's figures.
func (s *Store) UseBalance(ctx context.Context, key, record string, l Limit, amount int64, ttl time.Duration) (Use, error) {
	w, b, err := periodArgs(l.Periods)
	if err != nil || amount < 1 || l.Limit < 1 || ttl < time.Millisecond || record == "" {
		return Use{}, fmt.Errorf("bucket: use of %q: %w", key, ErrInvalidRequest)
	}
	arr, err := s.grantRun(ctx, key, []string{record}, "use", itoa(amount), w, b, itoa(ttl.Milliseconds()), itoa(l.Limit), l.Thresholds, l.Journal)
	if err != nil {
		return Use{}, fmt.Errorf("bucket: use of %q: %w", key, err)
	}
	if len(arr) < 6 {
		return Use{}, fmt.Errorf("bucket: use of %q: %w", key, ErrMalformedReply)
	}
	taken, err1 := strconv.ParseInt(arr[1], 10, 64)
	excess, err2 := strconv.ParseInt(arr[2], 10, 64)
	bal, err3 := parseBalance(arr[6:])
	if err := errors.Join(err1, err2, err3); err != nil {
		return Use{}, fmt.Errorf("bucket: use of %q: %w", key, ErrMalformedReply)
	}
	moves := append(burnMoves(arr[4], false), periodMoves(arr[5])...)
	return Use{Replayed: arr[0] == "1", Taken: taken, Excess: excess, Told: parseTold(arr[3]), Moves: moves, Balance: bal}, nil
}

// periodArgs are periods as the script takes them (Limit.scriptArgs).
func periodArgs(periods calendar.Span) (w, b string, err error) {
	l := Limit{Algorithm: algorithm.Balance, Periods: periods}
	if err := l.validatePeriods(); err != nil {
		return "", "", err
	}
	wn, bn := l.scriptArgs()
	return itoa(wn), itoa(bn), nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// grant runs the grant script and reads its reply.
func (s *Store) grant(ctx context.Context, key, op string, args ...string) (Balance, error) {
	arr, err := s.grantRun(ctx, key, nil, op, args...)
	switch {
	case err == nil:
	case redis.HasErrorPrefix(err, "GRANT_EXISTS"):
		return Balance{}, ErrGrantExists
	case redis.HasErrorPrefix(err, "GRANT_UNKNOWN"):
		return Balance{}, ErrGrantUnknown
	case redis.HasErrorPrefix(err, "TOO_MANY_GRANTS"):
		return Balance{}, ErrTooManyGrants
	default:
		return Balance{}, fmt.Errorf("bucket: %s grant in %q: %w", op, key, err)
	}
	b, err := parseBalance(arr)
	if err != nil {
		return Balance{}, fmt.Errorf("bucket: %s grant in %q: %w", op, key, err)
	}
	return b, nil
}

// grantRun runs the grant script on the balance at key (with its metadata and more, keys in
// its slot) and returns its reply.
func (s *Store) grantRun(ctx context.Context, key string, more []string, op string, args ...string) ([]string, error) {
	argv := append([]any{op, itoa(s.b.cfg.ClockOffset.Microseconds())}, anys(args)...)
	// Not retried by go-redis (scriptCmd): a put or a void sent twice is harmless, and a use
	// has its record, but the caller must learn that the first one's outcome is unknown.
	keys := append([]any{key, key + "#meta"}, anys(more)...) // #meta: key's hash tag, its slot
	head := append([]any{"evalsha", grantScript.sha, len(keys)}, keys...)
	cmd := newScriptCmd(ctx, append(head, argv...), 1)
	_ = s.rdb.Process(ctx, scriptCmd{cmd})
	if isNoScript(cmd.Err()) {
		head[0], head[1] = "eval", grantScript.src
		cmd = newScriptCmd(ctx, append(head, argv...), 1)
		_ = s.rdb.Process(ctx, scriptCmd{cmd})
	}
	return cmd.Result()
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// parseBalance reads the grant script's reply.
func parseBalance(arr []string) (Balance, error) {
	if len(arr) < 4 || (len(arr)-4)%14 != 0 {
		return Balance{}, ErrMalformedReply
	}
	n := make([]int64, len(arr))
	for i, v := range arr {
		if i >= 4 && ((i-4)%14 == 0 || (i-4)%14 == 13) {
			continue // a grant's id, or what was kept with it
		}
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Balance{}, ErrMalformedReply
		}
		n[i] = x
	}
	b := Balance{Period: time.Unix(n[0], 0), Used: n[1], Overage: n[2], Now: time.UnixMilli(n[3])}
	ms := func(v int64) time.Time {
		if v == 0 {
			return time.Time{}
		}
		return time.UnixMilli(v)
	}
	for i := 4; i < len(arr); i += 14 {
		f := n[i+1 : i+13]
		b.Grants = append(b.Grants, Grant{ID: arr[i], Remaining: f[0], Amount: f[1], Priority: f[2],
			Effective: ms(f[3]), Expires: ms(f[4]), Created: ms(f[5]), Recurring: f[6] == 1,
			RolloverMin: f[7], RolloverMax: f[8], Voided: ms(f[9]), IssuedFor: time.Unix(f[10], 0), Live: f[11] == 1, Meta: arr[i+13]})
	}
	return b, nil
}
