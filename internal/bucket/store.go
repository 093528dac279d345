package bucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// Store keeps buckets in Redis (standalone, Sentinel or Cluster). Each Request is one call of
// the check script, which reads the time from Redis and updates all the request's limits
// atomically.
//
// Script calls go through a micro-batcher: the calls of concurrent Checks are sent together,
// one pipeline per batch, by a few goroutines (StoreConfig.Loops), without ever waiting for
// more calls to arrive. The calls of one Check always travel in one pipeline. The goroutines
// start with the first Check and stop on Close: a Store must be closed by its owner.
type Store struct {
	rdb    redis.UniversalClient
	b      *batcher
	script *script // the check script of StoreConfig.Layout
	// hashes is StoreConfig.SharedHashes in the layouts that read shared hashes (mixed and
	// shared), else 0: the calls' KEYS then name no shared hashes.
	hashes int
}

// NewStore returns a Store using rdb with the default StoreConfig. The script is loaded
// lazily: a call that finds it missing is re-sent as EVAL, which caches it.
func NewStore(rdb redis.UniversalClient) *Store {
	return NewStoreWithConfig(rdb, StoreConfig{})
}

// NewStoreWithConfig returns a Store using rdb, batching as cfg says (zero fields mean the
// defaults). With a Cluster client each pipeline is split by go-redis per node; every
// request's keys are in one slot.
func NewStoreWithConfig(rdb redis.UniversalClient, cfg StoreConfig) *Store {
	b := newBatcher(rdb, cfg)
	s := &Store{rdb: rdb, b: b, script: checkScripts[b.cfg.Layout]}
	if cfg.ClockOffset != 0 {
		b.batch = scriptsOf(batchHead, "batch.lua", cfg.ClockOffset)[b.cfg.Layout]
		b.lib = librariesOf(cfg.ClockOffset)[b.cfg.Layout]
		s.script = scriptsOf(checkHead, "check.lua", cfg.ClockOffset)[b.cfg.Layout]
	}
	if b.cfg.Layout.fields() {
		s.hashes = b.cfg.SharedHashes
	}
	return s
}

// Close stops the Store's batching goroutines and returns once they have, which may take a
// batch in flight (at most StoreConfig.BatchTimeout); it does not close the Redis client.
// Checks waiting or started afterwards fail with ErrStoreClosed. Every Store must be closed:
// nothing else stops its goroutines. Close may be called more than once.
func (s *Store) Close() error {
	s.b.close()
	return nil
}

// getJob returns a pooled job for calls of s's script.
func (s *Store) getJob() *job {
	j := getJob()
	j.script, j.hashes = s.script, s.hashes
	return j
}

// Script modes (ARGV[3]; lua/call.lua).
const (
	modeCharge     = iota // charge; with a record: replay, or write it when allowed
	modePeek              // evaluate only
	modeRefund            // give a charge back; with a record: delete it
	modeRecord            // write the record alone
	modeChargeOnly        // charge; with a record: replay, never write it
	modeCount             // charge allowed or not (Request.Count); never a record
)

// Pre-boxed constant arguments: boxing a string into an interface allocates, these do not.
var (
	argModes       = [...]any{modeCharge: "0", modePeek: "1", modeRefund: "2", modeRecord: "3", modeChargeOnly: "4", modeCount: "6"}
	argZero    any = "0"
	argOne     any = "1"
	argEmpty   any = ""
	argNoIdem  any = "0"
	argIdemTTL any = strconv.FormatInt(IdempotencyTTL.Milliseconds(), 10)
	// argCodes are the algorithm codes (the algorithm.ID in decimal), indexed by algorithm.ID.
	argCodes = func() (codes [len(evals)]any) {
		for a := range codes {
			codes[a] = strconv.Itoa(a)
		}
		return codes
	}()
)

// ErrIdempotencyConflict is wrapped by Check's error when the call's idempotency record was
// written for another Fingerprint: the key was reused for a different request. Nothing stays
// charged: the script changed nothing, and the other requests of the call are refunded as
// after a denial. Package checker exports this very value as checker.ErrIdempotencyConflict:
// one sentinel, so that the engine and any Store it is given mean the same by it.
var ErrIdempotencyConflict = errors.New("idempotency key already used with another request")

// errWaitedTwice is a Pending's second Wait: its replies were the first Wait's.
var errWaitedTwice = errors.New("bucket: pending check waited for twice")

// errTwoRecords is a call with more than one idempotency record: a call is one checked
// request, and it has one record.
var errTwoRecords = errors.New("more than one request carries an idempotency key")

// conflictPrefix starts the script's error reply for ErrIdempotencyConflict (lua/call.lua).
const conflictPrefix = "IDEMPOTENCY_CONFLICT "

// Reply layout (see lua/call.lua).
const (
	replyHead     = 3
	replyPerLimit = 6
)

// Check evaluates every request in one round trip and charges each allowed one, unless Peek.
// When any request that is neither Peek nor Shadow is denied, the requests it charged
// (Shadow ones included, but for one that Replaces the only limit that denied: Kept) are
// refunded in a second round trip and marked Refunded, so that a call is charged either
// everywhere or nowhere. An error means the outcome is unknown: the requests whose charges
// are known to have happened (on a Redis Cluster, those whose masters answered while
// another's did not) are refunded in the background, within StoreConfig.BatchTimeout, and a
// refund that fails is logged (StoreConfig.Logger).
//
// When ctx ends while the calls are queued, they are never sent. When it ends while they are
// in flight, Check returns ctx.Err() (wrapped) at once; the calls go on, since a pipeline runs
// for StoreConfig.BatchTimeout whatever the deadlines of the Checks it carries (ctx bounds only
// this Check's wait), and the charges their replies report are refunded in the background.
//
// With an idempotency key (Request.IdempotencyKey, on one request of the call: the record
// stands for the whole call) a retry is replayed: the record's request charges nothing, the
// others' charges are refunded in a second round trip, and every result is Replayed, the
// enforced ones Allowed. A record bound to another Fingerprint fails the call with an error
// wrapping ErrIdempotencyConflict, the other requests' charges refunded first. The record is
// written only for an allowed call: by the record request's own script call when no other
// request can deny the call, else once every reply is in, by one more script call in the
// record's slot (a call of several slots on a Redis Cluster has no other way to know the
// decision atomically). A write that fails is logged; the decision stands, and a retry would be
// charged again, which errs towards denying.
func (s *Store) Check(ctx context.Context, reqs []Request) ([]Result, error) {
	p := s.Send(ctx, reqs)
	return p.Wait()
}

// Pending is a Check on its way: Send queued its script calls, Wait returns what Check
// would. Between the two the caller may Send more, so that the calls of many Checks leave in
// one batch without a goroutine each (a batch RPC's checks).
type Pending struct {
	s    *Store
	ctx  context.Context
	reqs []Request
	j    *job
	err  error
	// rec is the request carrying the call's idempotency record (-1: none); written, the
	// request whose script call writes it itself (-1: none, written once every reply is in).
	rec, written int
	nlims        int
	// done marks a Pending made finished (Done): Wait returns res and err.
	done bool
	res  []Result
}

// Done returns a Pending already finished with results and err: what a store that answers at
// once (a test's wrapper of Store that injects faults) returns from its Send, so that its
// callers take the one path of Send and Wait.
func Done(results []Result, err error) Pending {
	return Pending{done: true, res: results, err: err}
}

// Send queues the script calls of a Check of reqs and returns at once (it blocks only while
// the Store's queue is full, within ctx). reqs must not change until Wait returns; ctx bounds
// the wait as it bounds Check's. Every Pending must be waited for, once: Wait recycles what
// Send took.
func (s *Store) Send(ctx context.Context, reqs []Request) Pending {
	p := Pending{s: s, ctx: ctx, reqs: reqs, rec: -1, written: -1}
	if len(reqs) == 0 {
		return p
	}
	nstrs, nnums, nargs := 0, 0, 0
	for i := range reqs {
		r := &reqs[i]
		if err := r.Validate(); err != nil {
			p.err = fmt.Errorf("bucket: request %d: %w", i, err)
			return p
		}
		if r.IdempotencyKey != "" && !r.Peek {
			if p.rec >= 0 {
				p.err = fmt.Errorf("bucket: requests %d and %d: %w: %w", p.rec, i, ErrInvalidRequest, errTwoRecords)
				return p
			}
			p.rec = i
		}
		nstrs, nnums, nargs = growFor(r, nstrs, nnums, nargs)
		p.nlims += len(r.Limits)
	}
	rec := p.rec
	recMode := modeChargeOnly
	if rec >= 0 && decidesAlone(reqs, rec) {
		p.written, recMode = rec, modeCharge
	}

	j := s.getJob()
	j.reserve(len(reqs), nstrs, nnums, nargs)
	for i := range reqs {
		mode := modeCharge
		switch {
		case reqs[i].Peek:
			mode = modePeek
		case i == rec:
			mode = recMode
		case reqs[i].Count:
			mode = modeCount
		}
		j.addCall(&reqs[i], mode, i == rec, "", nil)
	}
	if err := s.b.enqueue(ctx, j); err != nil {
		p.err = fmt.Errorf("bucket: %w", err)
		return p
	}
	p.j = j
	return p
}

// Wait waits for the replies of p's calls and returns what Check returns. A second Wait
// returns errWaitedTwice.
func (p *Pending) Wait() ([]Result, error) {
	if p.done {
		res, err := p.res, p.err
		p.done, p.res, p.err = false, nil, errWaitedTwice
		return res, err
	}
	if p.err != nil || len(p.reqs) == 0 {
		return nil, p.err
	}
	s, ctx, reqs, j, rec, written := p.s, p.ctx, p.reqs, p.j, p.rec, p.written
	p.j, p.err = nil, errWaitedTwice
	inFlight, err := s.b.await(ctx, j, true)
	runtime.KeepAlive(s) // the Store must outlive the wait, or its cleanup stops the loops
	if inFlight {
		go s.settleLate(context.WithoutCancel(ctx), j, slices.Clone(reqs), written)
	}
	if err != nil {
		return nil, fmt.Errorf("bucket: %w", err)
	}

	results, failed, denied, firstErr := p.parse(j)
	replay := rec >= 0 && (failed == nil || !failed[rec]) && results[rec].Replayed
	if firstErr == nil && !denied && !replay {
		putJob(j)
		if rec >= 0 && written < 0 {
			s.writeRecord(ctx, &reqs[rec])
		}
		return results, nil
	}

	// A denial, a replay or a failure: give back what was charged.
	var refund []int
	for i := range reqs {
		if (failed == nil || !failed[i]) && !reqs[i].Peek && results[i].Allowed && !results[i].Replayed &&
			(firstErr != nil || replay || !kept(reqs, results, i)) {
			refund = append(refund, i)
		}
	}
	j = refundJob(j, reqs, results, refund, written)
	if err := ended(ctx); firstErr != nil && err != nil {
		firstErr = fmt.Errorf("bucket: %w (%w)", err, firstErr)
	}
	switch {
	case j == nil && firstErr != nil:
		return nil, firstErr
	case j == nil:
		return replayed(reqs, results, replay), nil
	case firstErr != nil && !errors.Is(firstErr, ErrIdempotencyConflict):
		// The outcome is unknown, and the caller decides without it (fail modes): it need not
		// wait for the refund of the charges known to have happened (on a Redis Cluster, those
		// of the masters that answered). The refund gets a deadline of its own, since the
		// caller's may be what failed the call.
		go s.refundLater(context.WithoutCancel(ctx), j)
		return nil, firstErr
	}
	err = s.refund(ctx, j, results, refund)
	if firstErr != nil {
		return nil, firstErr
	}
	if err != nil {
		return nil, err
	}
	return replayed(reqs, results, replay), nil
}

// parse reads the replies of p's calls (job j): the results, which requests failed (nil when
// none did; firstErr is the first failure), and whether an enforced request denied.
func (p *Pending) parse(j *job) (results []Result, failed []bool, denied bool, firstErr error) {
	reqs := p.reqs
	results = make([]Result, len(reqs))
	lrs := make([]LimitResult, p.nlims)
	for i := range reqs {
		n := len(reqs[i].Limits)
		results[i].Limits, lrs = lrs[:n:n], lrs[n:]
		if err := parseReply(j.calls[i].cmd, &results[i]); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bucket: request %d: %w", i, err)
				failed = make([]bool, len(reqs))
			}
			failed[i] = true
			continue
		}
		if !reqs[i].Peek && !reqs[i].Shadow && !results[i].Allowed {
			denied = true
		}
		if !reqs[i].Peek && !results[i].Replayed {
			fillDelays(&reqs[i], &results[i])
			fillMoves(&reqs[i], &results[i])
		}
	}
	return results, failed, denied, firstErr
}

// fillMoves sets what each balance of res, the charge of r, told and moved, from its refund
// token (lua/balance.lua), which keeps them all for its refund.
func fillMoves(r *Request, res *Result) {
	for k := range r.Limits {
		if r.Limits[k].Algorithm == algorithm.Balance && k < len(res.refund) && res.refund[k] != "" {
			res.Limits[k].Balance = change(toldOf(res.refund[k]), chargeMoves(res.refund[k], false))
		}
	}
}

// fillDelays sets the Delay of each allowed limit of res, the charge of r, that is a queue.
func fillDelays(r *Request, res *Result) {
	for k := range r.Limits {
		if lr := &res.Limits[k]; r.Limits[k].MaxDelay > 0 && lr.Allowed {
			lr.Delay = queueDelay(&r.Limits[k], res.Now, lr.ResetAt)
		}
	}
}

// kept reports whether request i of a decided call keeps its charge although the call was
// denied: a request that Replaces an enforced limit, when that limit is the only enforced one
// that denied. It reads each limit's Allowed, so results must be those of a whole call.
func kept(reqs []Request, results []Result, i int) bool {
	key := reqs[i].Replaces
	if key == "" {
		return false
	}
	for k := range reqs {
		if reqs[k].Peek || reqs[k].Shadow || results[k].Allowed {
			continue
		}
		for m := range reqs[k].Limits {
			if !results[k].Limits[m].Allowed && reqs[k].Limits[m].Key != key {
				return false
			}
		}
	}
	return true
}

// decidesAlone reports whether request rec is the only one of reqs that can deny the call:
// the only charge that is not Shadow.
func decidesAlone(reqs []Request, rec int) bool {
	if reqs[rec].Shadow {
		return false
	}
	for i := range reqs {
		if i != rec && !reqs[i].Peek && !reqs[i].Shadow {
			return false
		}
	}
	return true
}

// replayed turns the results of a replayed call (replay set) into the first decision: the
// record exists only for an allowed call, so every charge is Replayed, and every enforced one
// Allowed with each of its limits; the counters stay what they are now.
func replayed(reqs []Request, results []Result, replay bool) []Result {
	if !replay {
		return results
	}
	for i := range results {
		if reqs[i].Peek {
			continue
		}
		res := &results[i]
		res.Replayed = true
		if reqs[i].Shadow {
			continue
		}
		res.Allowed = true
		for k := range res.Limits {
			res.Limits[k].Allowed, res.Limits[k].RetryAfter = true, 0
		}
	}
	return results
}

// writeRecord stores the idempotency record of r, whose call was allowed, with one script call
// in its slot. It runs within StoreConfig.BatchTimeout even when ctx ends: the caller that
// leaves is the one most likely to retry. A failure is logged; the decision stands.
func (s *Store) writeRecord(ctx context.Context, r *Request) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.b.cfg.BatchTimeout)
	defer cancel()
	j := s.getJob()
	j.reserve(1, 2, 0, 9)
	j.addRecord(r.IdempotencyKey, r.Fingerprint)
	err := s.b.do(ctx, j)
	runtime.KeepAlive(s)
	if err == nil {
		err = j.calls[0].cmd.Err()
		putJob(j)
	}
	if err != nil && s.b.cfg.Logger != nil {
		s.b.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "writing an idempotency record failed; a retry of the check will be charged again",
			slog.String("key", r.IdempotencyKey), slog.Any("err", err))
	}
}

// settleLate waits for the replies of a Check whose caller left while its calls were in flight
// (its ctx ended), and refunds the charges they made: the caller got an error, and a Check that
// fails keeps no charge it knows of, whichever master made it (the caller's deadline no longer
// ends the batch, so the replies come after it left). reqs is the Check's, cloned; written is
// the request whose call wrote the idempotency record, which its refund deletes.
func (s *Store) settleLate(ctx context.Context, j *job, reqs []Request, written int) {
	<-j.done
	if j.err != nil {
		putJob(j) // answered without being sent
		return
	}
	results := make([]Result, len(reqs))
	var refund []int
	for i := range reqs {
		results[i].Limits = make([]LimitResult, len(reqs[i].Limits))
		if parseReply(j.calls[i].cmd, &results[i]) == nil && !reqs[i].Peek && results[i].Allowed && !results[i].Replayed {
			refund = append(refund, i)
		}
	}
	if j = refundJob(j, reqs, results, refund, written); j != nil {
		s.refundLater(ctx, j)
	}
}

// ended is ctx's error, or context.DeadlineExceeded once its deadline has passed: a socket
// deadline set from it can fire a moment before its timer does.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// growFor adds to the storage counts what one call for r needs (see job.addCall).
func growFor(r *Request, nstrs, nnums, nargs int) (int, int, int) {
	n := len(r.Limits)
	// keys, their shared hashes, idempotency key, charge time or fingerprint, one token per
	// limit
	nstrs += 3*n + 2
	nnums += 3 + 4*n // a queue limit's length takes one more
	nargs += 3 + 2*n + 1 + 5 + 5*n
	return nstrs, nnums, nargs
}

// refundJob turns j (the job of the charges, whose replies were read) into the job that gives
// back the charges of reqs[idx], or recycles it and returns nil when there are none. The
// refund of reqs[written] deletes the idempotency record its charge wrote.
func refundJob(j *job, reqs []Request, results []Result, idx []int, written int) *job {
	j.reset()
	if len(idx) == 0 {
		putJob(j)
		return nil
	}
	nstrs, nnums, nargs := 0, 0, 0
	for _, i := range idx {
		nstrs, nnums, nargs = growFor(&reqs[i], nstrs, nnums, nargs)
	}
	j.reserve(len(idx), nstrs, nnums, nargs)
	for _, i := range idx {
		j.addCall(&reqs[i], modeRefund, i == written, strconv.FormatInt(results[i].Now.UnixMicro(), 10), results[i].refund)
	}
	return j
}

// refund runs the refund job j of results[idx] and replaces their results by the state after
// the refund.
func (s *Store) refund(ctx context.Context, j *job, results []Result, idx []int) error {
	err := s.b.do(ctx, j)
	runtime.KeepAlive(s)
	if err != nil {
		return fmt.Errorf("bucket: refund: %w", err)
	}
	var firstErr error
	for k, i := range idx {
		// A refund undoes a charge's burns and what it told, not a new period's start: those
		// moves stay reported.
		var kept [][]Move
		for k := range results[i].Limits {
			kept = append(kept, keepPeriod(results[i].Limits[k].Moves()))
		}
		res := Result{Limits: results[i].Limits}
		if err := parseReply(j.calls[k].cmd, &res); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bucket: refund request %d: %w", i, err)
			}
			continue
		}
		res.Refunded = true
		res.refund = nil
		for l := range res.Limits {
			res.Limits[l].Balance = change(nil, kept[l])
		}
		results[i] = res
	}
	putJob(j)
	return firstErr
}

// refundLater runs the refund job j of a Check that failed, within StoreConfig.BatchTimeout. A
// refund that fails leaves its charges in place until their windows pass: the subjects were
// charged for checks that the fail modes answered, which errs towards denying. It is logged.
func (s *Store) refundLater(ctx context.Context, j *job) {
	ctx, cancel := context.WithTimeout(ctx, s.b.cfg.BatchTimeout)
	defer cancel()
	calls := len(j.calls)
	err := s.b.do(ctx, j)
	if err == nil {
		for k := range j.calls {
			if _, e := j.calls[k].cmd.Result(); e != nil && err == nil {
				err = e
			}
		}
		putJob(j)
	}
	if err != nil && s.b.cfg.Logger != nil {
		s.b.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "refund of a failed check's charges failed; they stay until their windows pass",
			slog.Int("requests", calls), slog.Any("err", err))
	}
}

// addCall appends the EVALSHA command of one script call for r (see lua/call.lua): KEYS
// are the limit keys, with record the idempotency record's key, and in the mixed and shared
// layouts (j.hashes > 0) the limits' shared hashes; ARGV is n, cost, mode,
// idempotency TTL, charge time (refund) or fingerprint (charge with a record), then code,
// limit, window, burst and refund token per limit. j must have been reserved for it.
func (j *job) addCall(r *Request, mode int, record bool, chargeNow string, tokens []string) {
	a0 := len(j.args)
	nk := len(r.Limits)
	idem := record && r.IdempotencyKey != "" && mode != modePeek
	if idem {
		nk++
	}
	if j.hashes > 0 {
		nk += len(r.Limits)
	}
	j.args = append(j.args, argEvalSha, j.script.sha, j.num(int64(nk)))
	for i := range r.Limits {
		j.args = append(j.args, j.str(r.Limits[i].Key))
	}
	idemArg := argNoIdem
	if idem {
		j.args = append(j.args, j.str(r.IdempotencyKey))
		idemArg = argIdemTTL
	}
	if j.hashes > 0 {
		for i := range r.Limits {
			j.args = append(j.args, j.str(sharedHash(r.Limits[i].Key, j.hashes)))
		}
	}
	// ARGV[5] is the charge time of a refund or the fingerprint of a charge, never both.
	arg5 := argEmpty
	switch {
	case chargeNow != "":
		arg5 = j.str(chargeNow)
	case idem && mode != modeRefund && r.Fingerprint != "":
		arg5 = j.str(r.Fingerprint)
	}
	j.args = append(j.args, j.num(int64(len(r.Limits))), j.num(r.Cost), argModes[mode], idemArg, arg5)
	for i := range r.Limits {
		l := &r.Limits[i]
		token := argEmpty
		switch {
		case i < len(tokens) && tokens[i] != "":
			token = j.str(tokens[i])
		case l.Algorithm.Holds() && mode != modeRefund:
			token = j.str(l.Holder) // the lease a charge takes
		case l.MaxDelay > 0 && mode != modeRefund:
			token = j.num(l.MaxDelay.Microseconds()) // a queue's length (lua/gcra.lua)
		case l.Journal != "" && mode != modeRefund:
			token = j.str(l.Thresholds + "|" + l.Journal) // a balance's thresholds and journal (lua/balance.lua)
		case l.Thresholds != "" && mode != modeRefund:
			token = j.str(l.Thresholds) // a balance's thresholds (lua/balance.lua)
		}
		w, b := l.scriptArgs()
		j.args = append(j.args, argCodes[l.Algorithm], j.num(l.Limit), j.num(w), j.num(b), token)
	}
	j.calls = append(j.calls, call{args: j.args[a0:len(j.args):len(j.args)], nkeys: nk, refund: mode == modeRefund})
}

// addRecord appends the script call that writes the idempotency record key, bound to
// fingerprint fp (mode record: no limits).
func (j *job) addRecord(key, fp string) {
	a0 := len(j.args)
	arg5 := argEmpty
	if fp != "" {
		arg5 = j.str(fp)
	}
	j.args = append(j.args, argEvalSha, j.script.sha, argOne, j.str(key), argZero, argOne, argModes[modeRecord], argIdemTTL, arg5)
	j.calls = append(j.calls, call{args: j.args[a0:len(j.args):len(j.args)], nkeys: 1})
}

// parseReply decodes a check script reply into res, whose Limits is already sized. The reply
// is read as strings (go-redis's StringSliceCmd), which allocates a third of what reading it
// as interfaces does: integers and strings alike arrive as their decimal text.
func parseReply(cmd *redis.StringSliceCmd, res *Result) error {
	arr, err := cmd.Result()
	if err != nil {
		return scriptError(err)
	}
	if len(arr) != replyHead+replyPerLimit*len(res.Limits) {
		return ErrMalformedReply
	}
	allowed, ok1 := parseBool(arr[0])
	now, ok2 := parseInt(arr[1])
	replayed, ok3 := parseBool(arr[2])
	if !ok1 || !ok2 || !ok3 {
		return ErrMalformedReply
	}
	res.Allowed = allowed
	res.Replayed = replayed
	res.Now = time.UnixMicro(now)
	for i := range res.Limits {
		f := arr[replyHead+replyPerLimit*i : replyHead+replyPerLimit*(i+1)]
		la, ok1 := parseBool(f[0])
		used, ok2 := parseInt(f[1])
		rem, ok3 := parseInt(f[2])
		reset, ok4 := parseInt(f[3])
		retry, ok5 := parseInt(f[4])
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return ErrMalformedReply
		}
		res.Limits[i] = LimitResult{
			Allowed:    la,
			Used:       used,
			Remaining:  rem,
			ResetAt:    time.UnixMicro(reset),
			RetryAfter: time.Duration(retry) * time.Microsecond,
		}
		if token := f[5]; token != "" {
			if res.refund == nil {
				res.refund = make([]string, len(res.Limits))
			}
			res.refund[i] = token
		}
	}
	return nil
}

// scriptError marks the script's idempotency conflict with ErrIdempotencyConflict. The Redis
// error stays in the chain: callers that sort errors into outages and bugs (checker's guard)
// must keep seeing a script reply, not a network failure.
func scriptError(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), conflictPrefix) {
		return fmt.Errorf("%w: %w", ErrIdempotencyConflict, err)
	}
	return err
}

func parseInt(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

func parseBool(s string) (bool, bool) {
	switch s {
	case "0":
		return false, true
	case "1":
		return true, true
	}
	return false, false
}

// Delete removes keys (a reset of the buckets) and returns how many existed. Each key is
// deleted by its own DEL, pipelined, because keys of different cluster slots cannot share one;
// in the mixed and shared layouts its field is deleted too (HDEL; a field that has expired
// but was not swept yet counts as one that existed).
func (s *Store) Delete(ctx context.Context, keys ...string) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	pipe := s.rdb.Pipeline()
	per := 1
	if s.hashes > 0 {
		per = 2
	}
	cmds := make([]*redis.IntCmd, 0, per*len(keys))
	for _, k := range keys {
		cmds = append(cmds, pipe.Del(ctx, k))
		if s.hashes > 0 {
			cmds = append(cmds, pipe.HDel(ctx, sharedHash(k, s.hashes), k))
		}
	}
	_, _ = pipe.Exec(ctx)
	var n int64
	for i := range keys {
		existed := false
		for _, cmd := range cmds[per*i : per*(i+1)] {
			d, err := cmd.Result()
			if err != nil {
				return n, fmt.Errorf("bucket: delete %q: %w", keys[i], err)
			}
			existed = existed || d > 0
		}
		if existed {
			n++
		}
	}
	return n, nil
}

// Ping reports whether Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("bucket: ping: %w", err)
	}
	return nil
}

// LoadScript caches the check and batch scripts in Redis and loads the batch function library
// (on every master of a cluster), so that the first checks after a Redis restart do not each
// pay a NOSCRIPT round trip and a compile. It also tells whether Redis answers. A Redis that
// refuses the library (before 7.0, or an ACL without FUNCTION LOAD) or the batch script (before
// 7.0) is no error: batches then go to the batch script, or every check as its own script call.
func (s *Store) LoadScript(ctx context.Context) error {
	if err := s.script.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("bucket: load script: %w", err)
	}
	if err := s.b.batch.Load(ctx, s.rdb).Err(); err != nil {
		if !unsupported(err) {
			return fmt.Errorf("bucket: load batch script: %w", err)
		}
		s.b.alone.Store(true)
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return s.loadLibrary(ctx, c)
		})
	} else {
		err = s.loadLibrary(ctx, s.rdb)
	}
	if err != nil {
		return fmt.Errorf("bucket: load batch function library: %w", err)
	}
	return nil
}

// loadLibrary loads the batch function library into c's server, unless it has it; a refusal
// (functionsRefused) sends batches to the batch script instead, and is no error.
func (s *Store) loadLibrary(ctx context.Context, c interface {
	Do(context.Context, ...any) *redis.Cmd
}) error {
	err := c.Do(ctx, s.b.lib.loadArgs...).Err()
	switch {
	case err == nil, strings.Contains(err.Error(), "already exists"):
		return nil
	case functionsRefused(err):
		s.b.noLib.Store(true)
		return nil
	}
	return err
}
