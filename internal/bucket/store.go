package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store keeps buckets in Redis (standalone, Sentinel or Cluster). Each Request is one call of
// the check script, which reads the time from Redis and updates all the request's limits
// atomically; the requests of one Check travel in one pipeline.
type Store struct {
	rdb redis.UniversalClient
}

// NewStore returns a Store using rdb. The script is loaded lazily: the first EVALSHA that
// finds it missing is re-sent as EVAL, which caches it.
func NewStore(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb}
}

// Script modes (ARGV[3]).
const (
	modeCharge = iota
	modePeek
	modeRefund
)

// Pre-boxed constant arguments: boxing a string into an interface allocates, these do not.
var (
	argModes       = [...]any{modeCharge: "0", modePeek: "1", modeRefund: "2"}
	argEmpty   any = ""
	argNoIdem  any = "0"
	argIdemTTL any = strconv.FormatInt(IdempotencyTTL.Milliseconds(), 10)
	argCodes       = [...]any{"0", "1", "2", "3", "4", "5", "6"}
)

// Reply layout (see lua/check.lua).
const (
	replyHead     = 3
	replyPerLimit = 6
)

// call is one script invocation and, once run, its command.
type call struct {
	keys []string
	args []any
	cmd  *redis.Cmd
}

// Check evaluates every request in one round trip and charges each allowed one, unless Peek.
// When any request that is neither Peek nor Shadow is denied, the requests it charged
// (Shadow ones included) are refunded in a second round trip and marked Refunded, so that a
// call is charged either everywhere or nowhere. An error
// means the outcome is unknown; charges that are known to have happened are refunded on a
// best-effort basis first.
func (s *Store) Check(ctx context.Context, reqs []Request) ([]Result, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	nkeys, nargs, nlims := 0, 0, 0
	for i := range reqs {
		r := &reqs[i]
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("bucket: request %d: %w", i, err)
		}
		nkeys += len(r.Limits) + 1
		nargs += 5 + 5*len(r.Limits)
		nlims += len(r.Limits)
	}

	// One backing array per kind for the whole call keeps allocations independent of the
	// number of requests.
	keys := make([]string, 0, nkeys)
	args := make([]any, 0, nargs)
	calls := make([]call, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		k0, a0 := len(keys), len(args)
		mode := modeCharge
		if r.Peek {
			mode = modePeek
		}
		keys, args = appendCall(keys, args, r, mode, argEmpty, nil)
		calls[i] = call{keys: keys[k0:len(keys):len(keys)], args: args[a0:len(args):len(args)]}
	}

	s.run(ctx, calls)

	results := make([]Result, len(reqs))
	lrs := make([]LimitResult, nlims)
	var firstErr error
	var failed []bool // allocated only when a request failed
	denied := false
	for i := range reqs {
		n := len(reqs[i].Limits)
		results[i].Limits, lrs = lrs[:n:n], lrs[n:]
		if err := parseReply(calls[i].cmd, &results[i]); err != nil {
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
	}
	if firstErr == nil && !denied {
		return results, nil
	}

	var refund []int
	for i := range reqs {
		if (failed == nil || !failed[i]) && !reqs[i].Peek && results[i].Allowed && !results[i].Replayed {
			refund = append(refund, i)
		}
	}
	err := s.refund(ctx, reqs, results, refund)
	if firstErr != nil {
		return nil, firstErr
	}
	if err != nil {
		return nil, err
	}
	return results, nil
}

// refund gives back the charges of reqs[idx] and replaces their results by the state after
// the refund.
func (s *Store) refund(ctx context.Context, reqs []Request, results []Result, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	calls := make([]call, len(idx))
	for j, i := range idx {
		charged := strconv.FormatInt(results[i].Now.UnixMicro(), 10)
		keys, args := appendCall(nil, nil, &reqs[i], modeRefund, charged, results[i].refund)
		calls[j] = call{keys: keys, args: args}
	}
	s.run(ctx, calls)
	var firstErr error
	for j, i := range idx {
		res := Result{Limits: results[i].Limits}
		if err := parseReply(calls[j].cmd, &res); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bucket: refund request %d: %w", i, err)
			}
			continue
		}
		res.Refunded = true
		res.refund = nil
		results[i] = res
	}
	return firstErr
}

// appendCall appends the keys and ARGV of one script call for r (see lua/check.lua).
func appendCall(keys []string, args []any, r *Request, mode int, chargeNow any, tokens []string) ([]string, []any) {
	for i := range r.Limits {
		keys = append(keys, r.Limits[i].Key)
	}
	idem := argNoIdem
	if r.IdempotencyKey != "" && mode != modePeek {
		keys = append(keys, r.IdempotencyKey)
		idem = argIdemTTL
	}
	args = append(args, len(r.Limits), r.Cost, argModes[mode], idem, chargeNow)
	for i := range r.Limits {
		l := &r.Limits[i]
		token := argEmpty
		if i < len(tokens) && tokens[i] != "" {
			token = tokens[i]
		}
		args = append(args, argCodes[l.Algorithm], l.Limit, l.windowUS(), l.Capacity(), token)
	}
	return keys, args
}

// run executes calls, setting their cmd: a single call directly, several in one pipeline.
// Calls that fail with NOSCRIPT are re-sent with EVAL, which also caches the script again.
func (s *Store) run(ctx context.Context, calls []call) {
	if len(calls) == 1 {
		c := &calls[0]
		c.cmd = checkScript.Run(ctx, s.rdb, c.keys, c.args...)
		return
	}
	hash := checkScript.Hash()
	pipe := s.rdb.Pipeline()
	for i := range calls {
		c := &calls[i]
		c.cmd = pipe.EvalSha(ctx, hash, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var retry redis.Pipeliner
	for i := range calls {
		c := &calls[i]
		if isNoScript(c.cmd.Err()) {
			if retry == nil {
				retry = s.rdb.Pipeline()
			}
			c.cmd = retry.Eval(ctx, checkSource, c.keys, c.args...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
}

var errMalformed = errors.New("malformed script reply")

// parseReply decodes a check script reply into res, whose Limits is already sized.
func parseReply(cmd *redis.Cmd, res *Result) error {
	v, err := cmd.Result()
	if err != nil {
		return err
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != replyHead+replyPerLimit*len(res.Limits) {
		return errMalformed
	}
	allowed, ok1 := arr[0].(int64)
	now, ok2 := parseInt(arr[1])
	replayed, ok3 := arr[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		return errMalformed
	}
	res.Allowed = allowed == 1
	res.Replayed = replayed == 1
	res.Now = time.UnixMicro(now)
	for i := range res.Limits {
		f := arr[replyHead+replyPerLimit*i : replyHead+replyPerLimit*(i+1)]
		la, ok1 := f[0].(int64)
		used, ok2 := f[1].(int64)
		rem, ok3 := f[2].(int64)
		reset, ok4 := parseInt(f[3])
		retry, ok5 := parseInt(f[4])
		token, ok6 := f[5].(string)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 {
			return errMalformed
		}
		res.Limits[i] = LimitResult{
			Allowed:    la == 1,
			Used:       used,
			Remaining:  rem,
			ResetAt:    time.UnixMicro(reset),
			RetryAfter: time.Duration(retry) * time.Microsecond,
		}
		if token != "" {
			if res.refund == nil {
				res.refund = make([]string, len(res.Limits))
			}
			res.refund[i] = token
		}
	}
	return nil
}

func parseInt(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// Delete removes keys (a reset of the buckets) and returns how many existed. Each key is
// deleted by its own DEL, pipelined, because keys of different cluster slots cannot share one.
func (s *Store) Delete(ctx context.Context, keys ...string) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Del(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	var n int64
	for i, cmd := range cmds {
		d, err := cmd.Result()
		if err != nil {
			return n, fmt.Errorf("bucket: delete %q: %w", keys[i], err)
		}
		n += d
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

// LoadScript caches the check script in Redis (on every master of a cluster), so that the
// first checks after a Redis restart do not each pay a NOSCRIPT round trip and a compile. It
// also tells whether Redis answers.
func (s *Store) LoadScript(ctx context.Context) error {
	if err := checkScript.Load(ctx, s.rdb).Err(); err != nil {
		return fmt.Errorf("bucket: load script: %w", err)
	}
	return nil
}
