package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// A reservation is a charge whose cost is settled later: Check charges an estimate, Mark
// records what it charged, and Settle charges or refunds the difference to the actual cost.
// Its record is one Redis key per request (per slot, so that a settle of one slot is one
// atomic script call, on a cluster too), holding
//
//	open <charge now_us> <estimate> <label>
//	<code> <limit> <window> <burst> <refund token or -> <key> <overage bound> <fit>    (one line per limit)
//
// where the overage bound is the most a settle charges the limit past the estimate (-1: none;
// Limit.OverageCap, and the estimate for a Pooled limit) and fit is 1 when the overage is
// charged only as far as it fits (Limit.Pooled). A line of a record written before these two
// fields has neither: its overage is charged whole, as it was then.
//
// which Settle reads back and sends to the check script (lua/call.lua, mode settle), which
// applies it only while the record still holds it and then turns it into "done <difference>":
// a settle sent twice never charges twice. The limits come from the record, never from the
// caller, so that no settle can touch a bucket its reservation did not charge.

// The outcomes of Settle that are the caller's, not the store's.
var (
	// ErrUnknownReservation is a reservation of which no record is left: never made (its
	// records never written), or expired (its estimate stands).
	ErrUnknownReservation = errors.New("bucket: unknown reservation (never made, or expired)")
	// ErrSettled is a reservation settled (or cancelled) before: nothing changes.
	ErrSettled = errors.New("bucket: reservation already settled")
)

// settledTTL is how long a settled reservation's record stays, so that a retried settle is told
// ErrSettled rather than ErrUnknownReservation.
const settledTTL = 10 * time.Minute

// Mark is one request's part of a reservation: Key is its record's key, in the slot of the
// request's limits; Request and Result are its charge (allowed, not refunded). Label is the
// caller's, kept in the record and given back by Settle (Settled.Label): 0 to 512 bytes of
// base64url, so that it stays one field of the record's first line.
type Mark struct {
	Key     string
	Request *Request
	Result  *Result
	Label   string
}

// Marked reports whether a request has a part in a reservation: whether it has a limit other
// than a concurrency one (a place in flight does not depend on cost, so a settle leaves it).
func Marked(r *Request) bool {
	for i := range r.Limits {
		if !r.Limits[i].Algorithm.Holds() {
			return true
		}
	}
	return false
}

// Mark writes the records of a reservation's parts, each expiring after ttl, in one pipeline.
// An error leaves the charges in place: the reservation is then settled at its estimate when
// its records are not all there, which errs towards denying.
func (s *Store) Mark(ctx context.Context, ttl time.Duration, marks []Mark) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("bucket: mark: %w: TTL must be at least 1ms, got %v", ErrInvalidRequest, ttl)
	}
	pipe := s.rdb.Pipeline()
	for _, m := range marks {
		if m.Key == "" || m.Request == nil || m.Result == nil || len(m.Result.Limits) != len(m.Request.Limits) || !validLabel(m.Label) {
			return fmt.Errorf("bucket: mark: %w: a key, a request and its result, a label of at most 512 base64url bytes", ErrInvalidRequest)
		}
		if rec := record(m.Request, m.Result, m.Label); rec != "" {
			pipe.Set(ctx, m.Key, rec, ttl)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("bucket: mark: %w", err)
	}
	return nil
}

// validLabel reports whether a label is at most 512 bytes of base64url.
func validLabel(l string) bool {
	if len(l) > 512 {
		return false
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// record is the record of one request's charge, "" when it has no limit a settle changes.
func record(r *Request, res *Result, label string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "open %d %d %s\n", res.Now.UnixMicro(), r.Cost, label)
	n := 0
	for i := range r.Limits {
		l := &r.Limits[i]
		if l.Algorithm.Holds() {
			continue
		}
		token := "-"
		if i < len(res.refund) && res.refund[i] != "" {
			token = res.refund[i]
		}
		w, bu := l.scriptArgs()
		fit := 0
		if l.Pooled {
			fit = 1
		}
		fmt.Fprintf(&b, "%d %d %d %d %s %s %d %d\n", l.Algorithm, l.Limit, w, bu, token, l.Key, l.overageBound(r.Cost), fit)
		n++
	}
	if n == 0 {
		return ""
	}
	return b.String()
}

// Settled is what Settle did.
type Settled struct {
	// Estimate is what the reservation charged.
	Estimate int64
	// Label is the one Mark was given.
	Label string
	// Now is Redis's time of the settle (of its last part).
	Now time.Time
	// Over is set when actual exceeded the estimate and the difference did not fit a limit: it
	// was charged all the same (the work is done), past that limit.
	Over bool
	// Keys and Limits are every settled limit's bucket key and state after the settle (as a
	// peek reports it), in the records' order; Limits[i].Allowed is false where the
	// difference did not fit.
	Keys   []string
	Limits []LimitResult
	// Parts counts the records settled now: all of them, but for a settle that finishes one a
	// failure interrupted.
	Parts int
}

// Settle settles the reservation whose records are keys (Mark's) at actual: each limit it
// charged is charged actual - estimate more, or refunded estimate - actual, in one atomic
// script call per record. A refund gives back what the algorithm's refund of a charge gives
// (for window algorithms, nothing once the charge's window has passed). An actual above the
// estimate is charged to a caller's own limit even past it, to a Pooled one only as far as it
// fits and at most the estimate again, and never more than a limit's OverageCap; an overage
// that did not fit whole is reported Over. A cancel is a settle at 0.
//
// The first record decides the outcome: it is settled last, so that once it is, every record
// is; of concurrent settles of one reservation exactly one succeeds, and a settle retried
// after a failure settles what is left.
//
// What it burns or gives back of a balance is journaled under journal (JournalArg: the
// settle's decision id), "" for none.
//
// Errors: ErrUnknownReservation when the first record is gone, ErrSettled when it was settled
// before, ErrInvalidRequest for bad arguments; anything else means the outcome is unknown (a
// retry then settles what is left, never twice).
func (s *Store) Settle(ctx context.Context, keys []string, actual int64, journal string) (Settled, error) {
	var out Settled
	if len(keys) == 0 || actual < 0 || actual > maxValue {
		return out, fmt.Errorf("bucket: settle: %w: at least one record and an actual cost in [0, %d]", ErrInvalidRequest, int64(maxValue))
	}
	pipe := s.rdb.Pipeline()
	gets := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		gets[i] = pipe.Get(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return out, fmt.Errorf("bucket: settle: read records: %w", err)
	}
	recs := make([]string, len(keys))
	for i, g := range gets {
		rec, err := g.Result()
		switch {
		case errors.Is(err, redis.Nil) && i == 0:
			return out, ErrUnknownReservation
		case errors.Is(err, redis.Nil):
		case err != nil:
			return out, fmt.Errorf("bucket: settle: read record %q: %w", keys[i], err)
		case strings.HasPrefix(rec, "done ") && i == 0:
			return out, ErrSettled
		case !strings.HasPrefix(rec, "done "):
			recs[i] = rec
		}
	}
	// The others first, then the first: k % n runs 1, 2, …, n-1, 0.
	for k := 1; k <= len(keys); k++ {
		i := k % len(keys)
		if recs[i] == "" {
			continue // gone or settled: a settle before this one failed after it
		}
		err := s.settlePart(ctx, keys[i], recs[i], actual, journal, &out)
		switch {
		case i > 0 && (errors.Is(err, ErrUnknownReservation) || errors.Is(err, ErrSettled)):
		case err != nil:
			return out, err
		}
	}
	return out, nil
}

// settlePart settles one record, rec as read from key.
func (s *Store) settlePart(ctx context.Context, key, rec string, actual int64, journal string, out *Settled) error {
	lines := strings.Split(strings.TrimSuffix(rec, "\n"), "\n")
	head := strings.Fields(lines[0])
	if len(head) < 3 || head[0] != "open" || len(lines) < 2 {
		return fmt.Errorf("bucket: settle %q: %w: malformed record", key, ErrMalformedReply)
	}
	estimate, err := strconv.ParseInt(head[2], 10, 64)
	if err != nil {
		return fmt.Errorf("bucket: settle %q: %w: malformed record", key, ErrMalformedReply)
	}
	if len(head) > 3 {
		out.Label = head[3]
	}
	n := len(lines) - 1
	nk := n + 1 // the limits' keys, the record's, and in the mixed and shared layouts the limits' hashes
	if s.hashes > 0 {
		nk += n
	}
	args := make([]any, 0, 4+nk+6+7*n)
	args = append(args, "evalsha", s.script.Hash(), nk)
	limits := make([][]string, n)
	for i, line := range lines[1:] {
		f := strings.Fields(line)
		switch len(f) {
		case 6: // written before overage bounds: the whole overage, as then
			f = append(f, "-1", "0")
		case 8:
		default:
			return fmt.Errorf("bucket: settle %q: %w: malformed record", key, ErrMalformedReply)
		}
		limits[i] = f
		args = append(args, f[5])
	}
	args = append(args, key)
	if s.hashes > 0 {
		for _, f := range limits {
			args = append(args, sharedHash(f[5], s.hashes))
		}
	}
	args = append(args, strconv.Itoa(n), strconv.FormatInt(actual-estimate, 10), "5",
		strconv.FormatInt(settledTTL.Milliseconds(), 10), rec)
	for _, f := range limits {
		token := f[4]
		if token == "-" {
			token = ""
		}
		args = append(args, f[0], f[1], f[2], f[3], token, f[6], f[7])
	}
	args = append(args, journal)
	// Not retried by go-redis (scriptCmd): a retry would be told ErrSettled by its own first
	// attempt; the caller must learn that the outcome is unknown instead.
	cmd := newScriptCmd(ctx, args, nk)
	_ = s.rdb.Process(ctx, scriptCmd{cmd})
	if isNoScript(cmd.Err()) {
		args[0], args[1] = "eval", s.script.src
		cmd = newScriptCmd(ctx, args, nk)
		_ = s.rdb.Process(ctx, scriptCmd{cmd})
	}
	if err := cmd.Err(); err != nil {
		var rerr redis.Error
		switch {
		case errors.As(err, &rerr) && rerr.Error() == "RESERVATION_UNKNOWN":
			return ErrUnknownReservation // expired since it was read: its estimate stands
		case errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "RESERVATION_SETTLED "):
			return ErrSettled // by a concurrent settle since it was read
		}
		return fmt.Errorf("bucket: settle %q: %w", key, err)
	}
	res := Result{Limits: make([]LimitResult, n)}
	if err := parseReply(cmd, &res); err != nil {
		return fmt.Errorf("bucket: settle %q: %w", key, err)
	}
	out.Estimate, out.Now, out.Parts = estimate, res.Now, out.Parts+1
	out.Over = out.Over || !res.Allowed
	for i, f := range limits {
		out.Keys = append(out.Keys, f[5])
		out.Limits = append(out.Limits, settledLimit(f[0], res, i, actual < estimate))
	}
	return nil
}

// settledLimit is limit i of a settle's reply res, of algorithm code: a balance's carries what
// the settle burned past the estimate, or gave back below it (back).
func settledLimit(code string, res Result, i int, back bool) LimitResult {
	lr := res.Limits[i]
	if code == strconv.Itoa(int(algorithm.Balance)) && i < len(res.refund) && res.refund[i] != "" {
		lr.Balance = change(nil, chargeMoves(res.refund[i], back))
	}
	return lr
}
