package bucket

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// runJob sends the calls of reqs (charges, the first with the idempotency record of its
// request, if any) as one job through s's batcher, so that they travel as one group, and
// returns the job for its calls' replies.
func runJob(t *testing.T, s *Store, reqs []Request) *job {
	t.Helper()
	j := s.getJob()
	nstrs, nnums, nargs := 0, 0, 0
	for i := range reqs {
		nstrs, nnums, nargs = growFor(&reqs[i], nstrs, nnums, nargs)
	}
	j.reserve(len(reqs), nstrs, nnums, nargs)
	for i := range reqs {
		j.addCall(&reqs[i], modeCharge, reqs[i].IdempotencyKey != "", "", nil)
	}
	if err := s.b.do(ctxT(t), j); err != nil {
		t.Fatalf("job: %v", err)
	}
	t.Cleanup(func() { putJob(j) })
	return j
}

// TestGroupCallsFailAlone: in one batch script run, a call that fails (a key of another type,
// an idempotency key reused for another request) fails alone, with the error it would have got
// alone; the calls before and after it are decided and charged, and a retry (its record holds
// its fingerprint, an extra of its call) is replayed uncharged.
func TestGroupCallsFailAlone(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	ctx := ctxT(t)
	wrong, idem := key(t, "list"), key(t, "idem")
	if err := c.RPush(ctx, wrong, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, idem, "another request", 0).Err(); err != nil {
		t.Fatal(err)
	}
	retried := key(t, "retried")
	if err := c.Set(ctx, retried, "same request", 0).Err(); err != nil {
		t.Fatal(err)
	}
	good := lim(key(t, "good"), algorithm.GCRA, 10, long, 0)
	conflict := one(lim(key(t, "idem-limit"), algorithm.FixedWindow, 10, long, 0), 1)
	conflict.IdempotencyKey, conflict.Fingerprint = idem, "this request"
	retry := one(lim(key(t, "retried-limit"), algorithm.FixedWindow, 10, long, 0), 1)
	retry.IdempotencyKey, retry.Fingerprint = retried, "same request"
	reqs := []Request{one(good, 1), one(lim(wrong, algorithm.TokenBucket, 10, long, 0), 1), conflict, one(good, 2), retry}
	j := runJob(t, s, reqs)

	var res Result
	res.Limits = make([]LimitResult, 1)
	tests := []struct {
		call      int
		remaining int64
		replayed  bool
		err       func(error) bool
		want      string
	}{
		{call: 0, remaining: 9},
		{call: 1, err: func(err error) bool { return redis.HasErrorPrefix(err, "WRONGTYPE") && !Unavailable(err) }, want: "WRONGTYPE, a script error"},
		{call: 2, err: func(err error) bool { return errors.Is(err, ErrIdempotencyConflict) }, want: "ErrIdempotencyConflict"},
		{call: 3, remaining: 7},
		{call: 4, remaining: 10, replayed: true},
	}
	for _, tt := range tests {
		err := parseReply(j.calls[tt.call].cmd, &res)
		switch {
		case tt.err != nil && (err == nil || !tt.err(err)):
			t.Errorf("call %d: got %v, want %s", tt.call, err, tt.want)
		case tt.err == nil && err != nil:
			t.Errorf("call %d: %v", tt.call, err)
		case tt.err == nil && (!res.Allowed || res.Limits[0].Remaining != tt.remaining || res.Replayed != tt.replayed):
			t.Errorf("call %d: got allowed %v remaining %d replayed %v, want true %d %v", tt.call, res.Allowed, res.Limits[0].Remaining, res.Replayed, tt.remaining, tt.replayed)
		}
	}
	if n, err := c.Exists(ctx, reqs[2].Limits[0].Key).Result(); err != nil || n != 0 {
		t.Errorf("the conflicting call's limit key: got %d keys (%v), want none: nothing charged", n, err)
	}
}

// TestBatchScriptMalformed: a batch whose counts do not add up to its arguments is refused
// whole, before any call runs.
func TestBatchScriptMalformed(t *testing.T) {
	t.Parallel()
	_, rdb := newStore(t)
	ctx := ctxT(t)
	k := key(t, "k")
	c := serverOf(t, rdb, k)                       // on a cluster, the master that serves k
	call := []any{"1 1 0 0 0 6 10 60000000 10", k} // head (algorithm.GCRA, 10 per minute), key
	if testLayout.fields() {
		call = append(call, sharedHash(k, 1)) // and its shared hash
	}
	tests := []struct {
		name string
		args []any
	}{
		{"no calls", []any{0}},
		{"one call too many", append([]any{2}, call...)},
		{"arguments left over", append(append([]any{1}, call...), "extra")},
		{"a head short of its limit", []any{1, "1 1 0 0 0 6 10", k}},
		{"extras neither 0 nor n+1", []any{1, "1 1 0 0 3 6 10 60000000 10", k, "", "", ""}},
		{"not a number", append([]any{"x"}, call...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Eval(ctx, batchScripts[testLayout].src.(string), nil, tt.args...).Err()
			if err == nil || !strings.Contains(err.Error(), "malformed batch") {
				t.Errorf("got %v, want the malformed batch error", err)
			}
		})
	}
	if n, err := c.Exists(ctx, k, sharedHash(k, 1)).Result(); err != nil || n != 0 {
		t.Errorf("got %d keys (%v), want none: a malformed batch runs no call", n, err)
	}
	// The well-formed batch runs.
	arr, err := c.Eval(ctx, batchScripts[testLayout].src.(string), nil, append([]any{1}, call...)...).Slice()
	if err != nil || len(arr) != 2+replyPerLimit || arr[1] != int64(-2) || arr[2] != int64(1) {
		t.Errorf("well-formed batch: got %v, %v; want the instant, a quick call's marker and its 6 fields, allowed", arr, err)
	}
}

// TestGroupElsewhere: on a cluster, a group run on a master that does not serve one of its
// calls' slots (a stale slot map) fails that call alone, before it ran, with errElsewhere; the
// batcher then re-sends it alone through the cluster client, which finds its master.
func TestGroupElsewhere(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Skip("a cluster test (QUOTAFLOW_TEST_REDIS=cluster)")
	}
	ctx := ctxT(t)
	if err := s.LoadScript(ctx); err != nil { // on every master: the resend below is one round
		t.Fatal(err)
	}
	here := key(t, "here")
	node, err := cc.MasterForKey(ctx, here)
	if err != nil {
		t.Fatal(err)
	}
	var there string // a key of another master's slot
	tag := strings.NewReplacer("{", "", "}", "").Replace(key(t, "there"))
	for i := 0; there == ""; i++ {
		k := fmt.Sprintf("{%s-%d}", tag, i)
		if n, err := cc.MasterForKey(ctx, k); err == nil && n != node {
			there = k
		}
	}
	reqs := []Request{one(lim(here, algorithm.GCRA, 10, long, 0), 1), one(lim(there, algorithm.GCRA, 10, long, 0), 1)}
	j := s.getJob()
	defer putJob(j)
	j.reserve(2, 16, 16, 64)
	for i := range reqs {
		j.addCall(&reqs[i], modeCharge, false, "", nil)
	}
	g := &group{calls: []*call{&j.calls[0], &j.calls[1]}}
	pipe := node.Pipeline()
	s.b.build(ctx, g)
	_ = pipe.Process(ctx, scriptCmd{g.cmd})
	_, _ = pipe.Exec(ctx)
	s.b.settle(ctx, pipe, g)
	if err := j.calls[1].cmd.Err(); !errors.Is(err, errElsewhere) || !isRedirect(err) {
		t.Fatalf("the other master's call: got %v, want errElsewhere", err)
	}
	if n, err := cc.Exists(ctx, there).Result(); err != nil || n != 0 {
		t.Fatalf("the other master's key: got %d (%v), want none: the call did not run", n, err)
	}

	s.b.resend(ctx, cc.Pipeline(), []*job{j})
	res := Result{Limits: make([]LimitResult, 1)}
	for i := range reqs {
		if err := parseReply(j.calls[i].cmd, &res); err != nil || !res.Allowed || res.Limits[0].Remaining != 9 {
			t.Errorf("call %d after the resend: got allowed %v remaining %d (%v), want true 9", i, res.Allowed, res.Limits[0].Remaining, err)
		}
	}
}

// TestCallError sorts the messages batch.lua gives failed calls as a call alone would see
// them.
func TestCallError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		msg         string
		elsewhere   bool
		unavailable bool
	}{
		{"ERR Script attempted to access a non local key in a cluster node script: x", true, true},
		{"ERR Script attempted to execute a command while the cluster is down", false, true},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false, false},
		{"ERR bucket: malformed limit 1", false, false},
	}
	for _, tt := range tests {
		err := callError(tt.msg)
		if got := errors.Is(err, errElsewhere); got != tt.elsewhere {
			t.Errorf("%q: elsewhere got %v, want %v", tt.msg, got, tt.elsewhere)
		}
		if got := Unavailable(err); got != tt.unavailable {
			t.Errorf("%q: Unavailable got %v, want %v", tt.msg, got, tt.unavailable)
		}
	}
	if err := scriptError(callError(conflictPrefix + "fingerprint mismatch")); !errors.Is(err, ErrIdempotencyConflict) {
		t.Errorf("conflict: got %v, want ErrIdempotencyConflict", err)
	}
	var rerr redis.Error
	if !errors.As(callError("WRONGTYPE x"), &rerr) {
		t.Error("a call's error reply is no redis.Error")
	}
}

// TestUnsupported: the refusals of the batch script itself (a Redis before 7.0 reads its
// shebang as Lua) send every call alone; any other error does not.
func TestUnsupported(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want bool
	}{
		{replyError("ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'"), true},
		{replyError("ERR Unexpected flag in script shebang: allow-cross-slot-keys"), true},
		{replyError("NOSCRIPT No matching script. Please use EVAL."), false},
		{replyError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{errors.New("dial tcp: connection refused"), false},
	}
	for _, tt := range tests {
		if got := unsupported(tt.err); got != tt.want {
			t.Errorf("%v: got %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestGroupQuickCalls: a charge without an idempotency record in a batch is decided by
// batch.lua's quick path (quick for one limit, quickMany for several), without check's tables,
// and must answer as the same call sent alone (check.lua) answers: the same allowed, used and
// remaining for a run of charges up to and past the limits, and for a cost above a capacity a
// denial asking for at least a window. Every algorithm, both layouts.
func TestGroupQuickCalls(t *testing.T) {
	t.Parallel()
	for _, a := range allAlgorithms {
		for _, caps := range [][]int64{{3}, {3, 5, 2}} {
			t.Run(fmt.Sprintf("%s/%d-limits", a, len(caps)), func(t *testing.T) {
				t.Parallel()
				s, c := newStore(t)
				// A lone call goes to the library's quick path as well; one that Redis refused
				// goes as the check script (check.lua), which these answers are held to.
				checkScript := NewStoreWithConfig(c, storeConfig(StoreConfig{}))
				t.Cleanup(func() { checkScript.Close() })
				checkScript.b.noLib.Store(true)
				grouped, alone := key(t, "grouped"), key(t, "alone")
				costs := []int64{1, 2, 1, 1, 4}
				reqs := func(k string) []Request {
					rs := make([]Request, len(costs))
					for i, c := range costs {
						rs[i].Cost = c
						for l, cp := range caps {
							rs[i].Limits = append(rs[i].Limits, lim(fmt.Sprintf("%s:%d", k, l), a, cp, long, 0))
						}
					}
					return rs
				}
				j := runJob(t, s, reqs(grouped))
				want := reqs(alone)
				for i := range want {
					var got Result
					got.Limits = make([]LimitResult, len(caps))
					if err := parseReply(j.calls[i].cmd, &got); err != nil {
						t.Fatalf("grouped charge %d: %v", i, err)
					}
					res, err := checkScript.Check(ctxT(t), want[i:i+1])
					if err != nil {
						t.Fatalf("lone charge %d: %v", i, err)
					}
					if got.Allowed != res[0].Allowed || got.Replayed {
						t.Errorf("charge %d of cost %d: grouped allowed %v, alone %v; want the same", i, costs[i], got.Allowed, res[0].Allowed)
					}
					if d := res[0].Now.Sub(got.Now); got.Now.IsZero() || d < 0 || d > 5*time.Second {
						t.Errorf("charge %d: grouped decided at %v, alone (later) at %v; want the batch's instant", i, got.Now, res[0].Now)
					}
					for l, g := range got.Limits {
						w := res[0].Limits[l]
						if g.Allowed != w.Allowed || g.Used != w.Used || g.Remaining != w.Remaining {
							t.Errorf("charge %d of cost %d, limit %d: grouped %+v, alone %+v; want the same", i, costs[i], l, g, w)
						}
						if !g.Allowed && (g.RetryAfter <= 0 || costs[i] > caps[l] && g.RetryAfter < long) {
							t.Errorf("charge %d of cost %d, limit %d denied with retry_after %v; want > 0, and at least a window for a cost above the capacity", i, costs[i], l, g.RetryAfter)
						}
					}
				}
			})
		}
	}
}

// TestLibraryRefused: a Redis that refuses FCALL and FUNCTION LOAD (here an ACL user without
// them, as a managed Redis may have; a Redis before 7.0 does not know them) still decides
// every check exactly: the Store warns once and sends its batches to the batch script, and
// LoadScript is no error.
func TestLibraryRefused(t *testing.T) {
	t.Parallel()
	own, admin := ownServer(t)
	if err := admin.Do(ctxT(t), "acl", "setuser", "nofunctions", "on", ">pw", "~*", "&*", "+@all", "-fcall", "-function").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: own.Addr, Username: "nofunctions", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	var logged bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))

	for _, load := range []bool{false, true} {
		s := NewStoreWithConfig(c, storeConfig(StoreConfig{Logger: logger}))
		t.Cleanup(func() { s.Close() })
		if load {
			if err := s.LoadScript(ctxT(t)); err != nil {
				t.Fatalf("LoadScript as a user without FUNCTION LOAD: %v, want no error", err)
			}
			if !s.b.noLib.Load() {
				t.Errorf("after LoadScript: the Store still sends batches to the library")
			}
		}
		// A Check of two requests, one call: both charged or neither. Its two script calls
		// travel as one group.
		l1 := lim(key(t, fmt.Sprint("a", load)), algorithm.FixedWindow, 5, long, 0)
		l2 := lim(key(t, fmt.Sprint("b", load)), algorithm.TokenBucket, 5, long, 0)
		allowed := 0
		for range 8 {
			res, err := s.Check(ctxT(t), []Request{one(l1, 1), one(l2, 1)})
			if err != nil {
				t.Fatalf("Check as a user without FCALL (LoadScript %v): %v", load, err)
			}
			if res[0].Allowed && res[1].Allowed {
				allowed++
			}
		}
		if allowed != 5 {
			t.Errorf("LoadScript %v: %d of 8 checks allowed against limits of 5, want exactly 5", load, allowed)
		}
		if !s.b.noLib.Load() {
			t.Errorf("LoadScript %v: the Store still sends batches to the library after Redis refused it", load)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logged.String(), "refused the batch function library"); n != 1 {
		t.Errorf("logged the refusal %d times, want once (by the Store that met it in a batch):\n%s", n, logged.String())
	}
}

// lockedWriter serializes writes to w: the batching loops log concurrently.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFunctionsRefused: the refusals of FCALL or FUNCTION LOAD themselves send batches to the
// batch script; a missing function or any other error does not.
func TestFunctionsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want bool
	}{
		{replyError("ERR unknown command 'FCALL', with args beginning with: 'qf_0' '0' "), true},
		{replyError("NOPERM User nofunctions has no permissions to run the 'fcall' command"), true},
		{replyError("ERR Function not found"), false},
		{replyError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{errors.New("dial tcp: connection refused"), false},
	}
	for _, tt := range tests {
		if got := functionsRefused(tt.err); got != tt.want {
			t.Errorf("%v: got %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestDistribute: the batch reply is cut into each call's reply as it would have come alone,
// quick calls' replies restored with the batch's instant; a reply that does not add up fails
// the calls it cannot give a reply.
func TestDistribute(t *testing.T) {
	t.Parallel()
	one := []string{"1", "2", "3", "400", "0", ""}       // a quick call's limit fields
	two := append([]string{"0"}, append(one, one...)...) // allowed, then two limits' fields
	tests := []struct {
		name  string
		reply []string
		calls int
		want  [][]string // nil: ErrMalformedReply
		err   []string   // a call's error message, when want is nil for it and it is not malformed
	}{
		{"quick, one limit", append([]string{"77", "-2"}, one...), 1,
			[][]string{{"1", "77", "0", "1", "2", "3", "400", "0", ""}}, nil},
		{"quick, two limits", append([]string{"77", "-3"}, two...), 1,
			[][]string{append([]string{"0", "77", "0"}, append(one, one...)...)}, nil},
		{"as alone, then an error", []string{"", "2", "a", "b", "-1", "ERR x"}, 2,
			[][]string{{"a", "b"}, nil}, []string{"", "ERR x"}},
		{"quick without the instant", append([]string{"", "-2"}, one...), 1, [][]string{nil}, nil},
		{"quick call cut short", []string{"77", "-2", "1", "2"}, 1, [][]string{nil}, nil},
		{"a marker of more limits than the reply holds", append([]string{"77", "-9999999999"}, one...), 1, [][]string{nil}, nil},
		{"entries left over", append([]string{"77", "-2"}, append(one, "x")...), 1, [][]string{nil}, nil},
		{"empty", nil, 1, [][]string{nil}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := &group{cmd: redis.NewStringSliceCmd(context.Background())}
			g.cmd.SetVal(tt.reply)
			for range tt.calls {
				g.calls = append(g.calls, &call{cmd: redis.NewStringSliceCmd(context.Background())})
			}
			g.distribute()
			for i, c := range g.calls {
				got, err := c.cmd.Result()
				switch {
				case tt.want[i] != nil:
					if err != nil || !slices.Equal(got, tt.want[i]) {
						t.Errorf("call %d: got %q (%v), want %q", i, got, err, tt.want[i])
					}
				case tt.err != nil && tt.err[i] != "":
					if err == nil || err.Error() != tt.err[i] {
						t.Errorf("call %d: got %q (%v), want the error %q", i, got, err, tt.err[i])
					}
				case !errors.Is(err, ErrMalformedReply):
					t.Errorf("call %d: got %q (%v), want ErrMalformedReply", i, got, err)
				}
			}
		})
	}
}
