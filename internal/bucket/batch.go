package bucket

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/retry"
)

// StoreConfig tunes the micro-batcher of a Store. The zero value (or any field <= 0) means
// the defaults.
type StoreConfig struct {
	// Loops is the number of batching goroutines; each has at most one pipeline in flight.
	// Default 4.
	Loops int
	// MaxBatch is the number of script calls at which a loop stops adding queued calls to
	// its pipeline. The calls of one Check always travel together, so a batch may exceed it
	// by the last Check taken. Default 128.
	MaxBatch int
	// BatchTimeout bounds how long one pipeline may take. It is the Store's own deadline, the
	// same for every batch: a caller's deadline or cancellation bounds only that caller's wait,
	// never the batch its calls travel in, so that no caller can fail the others' calls by
	// giving up early. Default 1s.
	BatchTimeout time.Duration
	// OnRoundTrip, when set, is told the outcome of every batch sent to Redis: nil when Redis
	// answered each call, else the first error for which Unavailable reports true (Redis's
	// error reply, its connection, a pipeline that outlived BatchTimeout). It is what a circuit
	// breaker should count: unlike Check's error, it never reflects a caller's deadline, a
	// caller's cancellation or time spent queued in this process. It is called from the
	// batching goroutines and must not block.
	OnRoundTrip func(err error)
	// Layout is how the script writes the buckets it charges (layout.go): LayoutPrevious, the
	// default (and what an unknown value means), LayoutCompact, LayoutShared or LayoutMixed.
	// Each reads the keys of every layout; LayoutShared and LayoutMixed read the shared
	// hashes' fields too.
	Layout Layout
	// SharedHashes is how many hashes per cluster slot (16,384 slots, on one server too) hold
	// the buckets of LayoutShared: enough for at most about 100 buckets per hash, beyond which
	// Redis stores a hash as a table and a bucket costs about twice as much (1: up to about
	// 1.6M buckets; docs/performance.md). Changing it moves every bucket to another hash,
	// which starts it over. 0 means 1.
	SharedHashes int
	// ClockOffset is added to Redis's time by this Store's scripts: a test's way to decide
	// checks at another instant (a month's end) without waiting for it. Never set it in
	// production: Stores that disagree on the time disagree on every bucket.
	ClockOffset time.Duration
	// Logger receives what a Check cannot return: a refund that failed after the Check had
	// already returned its error. Nil means no log.
	Logger *slog.Logger
}

const (
	defaultLoops        = 4
	defaultMaxBatch     = 128
	defaultBatchTimeout = time.Second
	// queueLen is the minimum queue length; callers block (within their context) beyond it.
	queueLen = 4096
)

func (c StoreConfig) withDefaults() StoreConfig {
	if c.Loops <= 0 {
		c.Loops = defaultLoops
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = defaultMaxBatch
	}
	if c.BatchTimeout <= 0 {
		c.BatchTimeout = defaultBatchTimeout
	}
	if c.Layout >= layouts {
		c.Layout = LayoutPrevious
	}
	if c.SharedHashes <= 0 {
		c.SharedHashes = 1
	}
	return c
}

// ErrStoreClosed is returned by Check after Store.Close.
var ErrStoreClosed = errors.New("bucket: store closed")

// batcher is the timer-free micro-batcher behind Store: callers queue a job (the script
// calls of one Check) and wait; each of cfg.Loops goroutines blocks for one job, takes
// whatever else is queued up to cfg.MaxBatch calls, sends them in ONE pipeline and hands
// each job its replies. Nothing ever waits for more calls to arrive: under load the calls
// queue up while the loops' pipelines are in flight, which is what makes the batches.
type batcher struct {
	rdb   redis.UniversalClient
	cfg   StoreConfig
	queue chan *job
	quit  chan struct{}

	start sync.Once
	stop  sync.Once
	loops sync.WaitGroup
	// lib is the batch function library of the Store's layout, which groups are sent to (FCALL)
	// until Redis refuses it (functionsRefused): noLib is then set, and groups are sent to the
	// batch script, of the same code and reply, which Redis compiles and runs whole per call.
	lib   *library
	noLib atomic.Bool
	// batch is the batch script of the Store's layout; alone is set once Redis refused it
	// (unsupported): every call then goes alone.
	batch *script
	alone atomic.Bool
}

func newBatcher(rdb redis.UniversalClient, cfg StoreConfig) *batcher {
	cfg = cfg.withDefaults()
	return &batcher{
		rdb:   rdb,
		cfg:   cfg,
		queue: make(chan *job, max(queueLen, 2*cfg.Loops*cfg.MaxBatch)),
		quit:  make(chan struct{}),
		lib:   batchLibraries[cfg.Layout],
		batch: batchScripts[cfg.Layout],
	}
}

// minGroup is the fewest calls sent as a group. Through the library, one: a lone call's FCALL
// costs Redis a fraction of its check script's EVALSHA, which builds the whole script's
// closures. Through the batch script, two: a lone call goes as itself, which spares the batch
// script's unpacking.
func (b *batcher) minGroup() int {
	if b.noLib.Load() {
		return 2
	}
	return 1
}

// build sets g's command: FCALL of the library, or EVALSHA of the batch script once Redis
// refused the library.
func (b *batcher) build(ctx context.Context, g *group) {
	if b.noLib.Load() {
		g.build(ctx, argEvalSha, b.batch.sha)
		return
	}
	g.build(ctx, argFCall, b.lib.fn)
}

// close stops the loops and waits for them. A batcher closed before its first job never
// starts them: start is spent first, so that no loop is added while close waits.
func (b *batcher) close() {
	b.start.Do(func() {})
	b.stop.Do(func() { close(b.quit) })
	b.loops.Wait()
}

// Job states. A job is owned by its caller while building and reading it, by the queue and
// a loop in between; whoever sees it last puts it back in the pool.
const (
	jobIdle      uint32 = iota // owned by the caller
	jobQueued                  // in the queue
	jobRunning                 // taken by a loop
	jobDone                    // replies set, caller signalled
	jobAbandoned               // the caller left (context, close): the loop recycles it
)

// job is the script calls of one Check (or of its refunds) and the storage of their
// arguments. Arguments are passed to go-redis as pointers into this storage (*string,
// *int64), which go-redis writes like the values themselves, so building a call allocates
// nothing once a pooled job has grown to size.
type job struct {
	ctx    context.Context
	script *script // the Store's: its layout's
	hashes int     // the Store's (Store.hashes): its calls name their limits' shared hashes when > 0
	calls  []call
	err    error // the outcome instead of the replies: the caller's context ended first
	state  atomic.Uint32
	done   chan struct{} // one signal per run, when state becomes jobDone

	strs []string
	nums []int64
	args []any
}

// call is one script invocation: args is the whole EVALSHA command.
type call struct {
	args  []any
	nkeys int
	cmd   *redis.StringSliceCmd
	// sentTo is the master a cluster's call was last sent to straight (masters.add), nil when
	// it went through the cluster client: what resendRefused compares the new slot map with.
	sentTo *redis.Client
	// refund marks a refund's call, which a cluster never groups (masters.send).
	refund bool
}

// scriptCmd is how a script call travels: go-redis must never re-send it on its own. After a
// network error or timeout it cannot know whether the script ran, and running it twice would
// charge twice; the caller gets the error instead (an unknown outcome). Cluster redirections
// (MOVED, ASK) are not retries and still happen.
type scriptCmd struct{ *redis.StringSliceCmd }

func (scriptCmd) NoRetry() bool { return true }

// newScriptCmd makes the command of one script call; args[3:] start with its keys.
func newScriptCmd(ctx context.Context, args []any, nkeys int) *redis.StringSliceCmd {
	cmd := redis.NewStringSliceCmd(ctx, args...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

var jobPool = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

func getJob() *job { return jobPool.Get().(*job) }

// putJob clears j's references (so a pooled job keeps no Redis replies or caller data
// alive) and returns it to the pool.
func putJob(j *job) {
	j.reset()
	j.script, j.hashes = nil, 0
	j.state.Store(jobIdle)
	jobPool.Put(j)
}

// reset empties j for new calls of the same Store (it keeps j.script and j.hashes).
func (j *job) reset() {
	j.ctx, j.err = nil, nil
	clear(j.calls)
	j.calls = j.calls[:0]
	clear(j.strs)
	j.strs = j.strs[:0]
	j.nums = j.nums[:0]
	clear(j.args)
	j.args = j.args[:0]
}

// reserve sizes j's storage for calls script calls with nstrs strings, nnums numbers and
// nargs arguments in all, so that pointers into it stay valid while it is filled.
func (j *job) reserve(calls, nstrs, nnums, nargs int) {
	if cap(j.calls) < calls {
		j.calls = make([]call, 0, calls)
	}
	if cap(j.strs) < nstrs {
		j.strs = make([]string, 0, nstrs)
	}
	if cap(j.nums) < nnums {
		j.nums = make([]int64, 0, nnums)
	}
	if cap(j.args) < nargs {
		j.args = make([]any, 0, nargs)
	}
}

// str stores s in j and returns a pointer to it, a string argument for go-redis.
func (j *job) str(s string) *string {
	j.strs = append(j.strs, s)
	return &j.strs[len(j.strs)-1]
}

// num stores n in j and returns a pointer to it, an integer argument for go-redis.
func (j *job) num(n int64) *int64 {
	j.nums = append(j.nums, n)
	return &j.nums[len(j.nums)-1]
}

// Constant arguments, boxed once: boxing a string into an interface allocates.
var (
	argEvalSha any = "evalsha"
	argEval    any = "eval"
	argFCall   any = "fcall"
)

// do queues j and waits for its replies. On an error (ctx ended, store closed) j is no
// longer the caller's: it was recycled, or the batcher owns it and its calls may still run.
func (b *batcher) do(ctx context.Context, j *job) error {
	_, err := b.run(ctx, j, false)
	return err
}

// run is do, but with keep a caller that leaves while j's calls are in flight keeps j
// (inFlight): the loop signals j.done when the replies are in, and the caller must read them
// and recycle j (Store.settleLate), so that the charges they made can be refunded.
func (b *batcher) run(ctx context.Context, j *job, keep bool) (inFlight bool, err error) {
	if err := b.enqueue(ctx, j); err != nil {
		return false, err
	}
	return b.await(ctx, j, keep)
}

// enqueue queues j, blocking while the queue is full. On an error (ctx ended, store closed)
// j was recycled: it is no longer the caller's.
func (b *batcher) enqueue(ctx context.Context, j *job) error {
	b.start.Do(b.startLoops)
	j.ctx = ctx
	j.state.Store(jobQueued)
	select {
	case b.queue <- j:
		return nil
	case <-ctx.Done():
		putJob(j) // never queued
		return ctx.Err()
	case <-b.quit:
		putJob(j)
		return ErrStoreClosed
	}
}

// await is run's wait for j, queued by enqueue.
func (b *batcher) await(ctx context.Context, j *job, keep bool) (inFlight bool, err error) {
	select {
	case <-j.done:
		return false, j.result()
	case <-ctx.Done():
		err = ctx.Err()
	case <-b.quit:
		err = ErrStoreClosed
	}
	// Leave, unless the loop finished in the meantime: then the replies are there.
	if j.state.CompareAndSwap(jobQueued, jobAbandoned) {
		return false, err // never sent
	}
	if keep {
		return true, err
	}
	if j.state.CompareAndSwap(jobRunning, jobAbandoned) {
		return false, err
	}
	<-j.done
	return false, j.result()
}

// result is the outcome of a finished job; a failed job is recycled.
func (j *job) result() error {
	if err := j.err; err != nil {
		putJob(j)
		return err
	}
	return nil
}

func (b *batcher) startLoops() {
	for range b.cfg.Loops {
		b.loops.Go(b.loop)
	}
}

func (b *batcher) loop() {
	batch := make([]*job, 0, 16)
	pipe := b.rdb.Pipeline()
	g := new(group)
	var ms *masters
	if cc, ok := b.rdb.(*redis.ClusterClient); ok {
		ms = newMasters(cc, b)
	}
	for {
		var j *job
		select {
		case j = <-b.queue:
		case <-b.quit:
			return
		}
		batch = batch[:0]
		n := 0
		now := time.Now()
		if b.take(j, now) {
			batch, n = append(batch, j), len(j.calls)
		}
	drain:
		for n < b.cfg.MaxBatch {
			select {
			case j = <-b.queue:
				if b.take(j, now) {
					batch, n = append(batch, j), n+len(j.calls)
				}
			default:
				break drain
			}
		}
		if len(batch) > 0 {
			b.exec(pipe, ms, g, batch, now)
		}
		clear(batch)
	}
}

// take claims a queued job for a batch. A job whose caller left is recycled, and one whose
// context has ended is answered at once without being sent: nobody waits for its replies.
func (b *batcher) take(j *job, now time.Time) bool {
	if !j.state.CompareAndSwap(jobQueued, jobRunning) {
		putJob(j) // abandoned
		return false
	}
	err := j.ctx.Err()
	if err == nil {
		if d, ok := j.ctx.Deadline(); ok && !now.Before(d) {
			err = context.DeadlineExceeded
		}
	}
	if err != nil {
		j.err = err
		b.finish(j)
		return false
	}
	return true
}

// finish hands j back to its caller, or recycles it when the caller has left.
func (b *batcher) finish(j *job) {
	if j.state.CompareAndSwap(jobRunning, jobDone) {
		j.done <- struct{}{}
		return
	}
	putJob(j)
}

// exec sends the calls of batch in one pipeline — on a Redis Cluster, one per master (ms) —
// and finishes every job. The calls of a pipeline travel as one call of the batch script when
// there are several (g, group), each on its own otherwise. Three kinds of reply mean the call never ran, and only those calls
// are sent again, through pipe, until the batch's deadline:
//   - NOSCRIPT: the script cache was flushed, or Redis restarted or failed over, or the call
//     reached a master that never ran the script. The call is re-sent with EVAL, which also
//     caches the script again.
//   - MOVED or ASK, on a cluster: the slot has moved or is moving. The cluster client that pipe
//     belongs to follows the redirection.
//   - TRYAGAIN: a cluster is moving the call's slot and holds some of its keys on each side
//     (docs/scaling.md). The call is re-sent after a short pause, by when the slot's remaining
//     keys have usually moved.
//
// And one kind of error, on a cluster: the master's address refused the connection (notSent),
// so the call was never written. It is re-sent once the slot map, read again, gives its slot to
// another master: a replica promoted after the master died (masters.resendRefused).
//
// Nothing else is re-sent: a script call that may have run must never run twice (scriptCmd). A
// timeout, or a connection reset or closed after the call was written, says nothing of whether
// the script ran, and is the caller's unknown outcome.
//
// The batch's outcome (OnRoundTrip) is that of its calls after the re-sends: a call refused and
// then answered by the new master is no failure of Redis, and does not count towards a circuit.
//
// The batch runs until BatchTimeout, whatever its callers' deadlines: a caller that gives up
// early leaves (batcher.do), the others' calls go on.
func (b *batcher) exec(pipe redis.Pipeliner, ms *masters, g *group, batch []*job, now time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(b.cfg.BatchTimeout))
	defer cancel()

	if ms != nil {
		ms.send(ctx, batch)
	} else {
		b.send(ctx, pipe, g, batch)
	}

	pause := retry.Backoff{Min: tryAgainPause, Max: maxTryAgainPause}
	for range maxResends {
		again, tryAgain := resends(batch)
		if again > 0 {
			if tryAgain && !retry.Sleep(ctx, pause.Next()) {
				break // the calls keep their TRYAGAIN: they did not run
			}
			b.resend(ctx, pipe, batch)
		}
		rerouted := 0
		if ms != nil {
			rerouted = ms.resendRefused(ctx, batch)
		}
		if again == 0 && rerouted == 0 {
			break
		}
	}
	if b.cfg.OnRoundTrip != nil {
		b.cfg.OnRoundTrip(outage(batch))
	}
	for _, j := range batch {
		b.finish(j)
	}
}

// send runs the first round of batch's calls on a standalone server: as one group when there
// are several, each alone otherwise or once Redis refused the batch script.
func (b *batcher) send(ctx context.Context, pipe redis.Pipeliner, g *group, batch []*job) {
	g.reset()
	for _, j := range batch {
		for i := range j.calls {
			g.calls = append(g.calls, &j.calls[i])
		}
	}
	if len(g.calls) < b.minGroup() || b.alone.Load() {
		for _, c := range g.calls {
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			_ = pipe.Process(ctx, scriptCmd{c.cmd})
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		return
	}
	b.build(ctx, g)
	_ = pipe.Process(ctx, scriptCmd{g.cmd})
	_, _ = pipe.Exec(ctx)
	b.settle(ctx, pipe, g)
}

// settle distributes the replies of group g, sent through pipe, to its calls, after sending it
// again where it did not run: after loading the library when Redis did not have it (a new
// server, FUNCTION FLUSH, a master that never had it); to the batch script once Redis refused the
// library (functionsRefused), with EVAL when Redis had not cached the script; each call alone
// when Redis refused the script too (unsupported).
func (b *batcher) settle(ctx context.Context, pipe redis.Pipeliner, g *group) {
	if g.fcall {
		b.settleLibrary(ctx, pipe, g)
	}
	err := g.cmd.Err()
	switch {
	case isNoScript(err):
		g.build(ctx, argEval, b.batch.src)
		_ = pipe.Process(ctx, scriptCmd{g.cmd})
		_, _ = pipe.Exec(ctx)
	case unsupported(err):
		if !b.alone.Swap(true) && b.cfg.Logger != nil {
			b.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "Redis refused the batch script (Redis 7.0 or later runs it); every check is sent as its own script call",
				slog.Any("err", err))
		}
		for _, c := range g.calls {
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			_ = pipe.Process(ctx, scriptCmd{c.cmd})
		}
		_, _ = pipe.Exec(ctx)
		return
	}
	g.distribute()
}

// settleLibrary sends group g again, built as an FCALL of the library, where Redis did not run
// it. When Redis did not have the library, it loads it and calls it again (a load that finds the
// library loaded meanwhile fails harmlessly). When the call still finds no function (a flush
// between the two, a load that failed) or Redis refused FCALL or FUNCTION LOAD
// (functionsRefused), it sends the group to the batch script; a refusal sends every later group
// there too.
func (b *batcher) settleLibrary(ctx context.Context, pipe redis.Pipeliner, g *group) {
	err := g.cmd.Err()
	if isNoFunction(err) {
		load := redis.NewStatusCmd(ctx, b.lib.loadArgs...)
		_ = pipe.Process(ctx, load)
		g.build(ctx, argFCall, b.lib.fn)
		_ = pipe.Process(ctx, scriptCmd{g.cmd})
		_, _ = pipe.Exec(ctx)
		err = g.cmd.Err()
		if lerr := load.Err(); isNoFunction(err) && lerr != nil && !strings.Contains(lerr.Error(), "already exists") {
			err = lerr // why the library is still missing
		}
	}
	refused := functionsRefused(err)
	if !refused && !isNoFunction(err) {
		return
	}
	if refused && !b.noLib.Swap(true) && b.cfg.Logger != nil {
		b.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "Redis refused the batch function library (FCALL or FUNCTION LOAD); batches are sent to the batch script",
			slog.Any("err", err))
	}
	g.build(ctx, argEvalSha, b.batch.sha)
	_ = pipe.Process(ctx, scriptCmd{g.cmd})
	_, _ = pipe.Exec(ctx)
}

// resend sends again, through pipe, the calls of batch answered NOSCRIPT (with EVAL), TRYAGAIN
// or a redirection.
func (b *batcher) resend(ctx context.Context, pipe redis.Pipeliner, batch []*job) {
	for _, j := range batch {
		for i := range j.calls {
			c := &j.calls[i]
			switch err := c.cmd.Err(); {
			case isNoScript(err):
				args := make([]any, len(c.args))
				copy(args, c.args)
				args[0], args[1] = argEval, j.script.src
				c.args = args
			case !isTryAgain(err) && !isRedirect(err):
				continue
			}
			c.cmd = newScriptCmd(ctx, c.args, c.nkeys)
			c.sentTo = nil // the cluster client picks the master
			_ = pipe.Process(ctx, scriptCmd{c.cmd})
		}
	}
	_, _ = pipe.Exec(ctx)
}

// outage is the first error of batch's calls that says Redis could not answer (Unavailable),
// or nil when Redis answered them all, if only with a script's error reply.
func outage(batch []*job) error {
	for _, j := range batch {
		for i := range j.calls {
			if err := j.calls[i].cmd.Err(); Unavailable(err) {
				return err
			}
		}
	}
	return nil
}

// Re-sending calls that did not run: the pause before re-sending TRYAGAIN calls doubles from
// tryAgainPause to maxTryAgainPause; maxResends bounds the rounds, so that a slot stuck in
// migration fails its calls at the deadline at the latest.
const (
	tryAgainPause    = 2 * time.Millisecond
	maxTryAgainPause = 50 * time.Millisecond
	maxResends       = 100
)

// resends counts the calls of batch to send again, and reports whether one of them was
// answered TRYAGAIN.
func resends(batch []*job) (again int, tryAgain bool) {
	for _, j := range batch {
		for i := range j.calls {
			switch err := j.calls[i].cmd.Err(); {
			case isTryAgain(err):
				tryAgain = true
				again++
			case isNoScript(err), isRedirect(err):
				again++
			}
		}
	}
	return again, tryAgain
}

// isTryAgain reports a Redis Cluster's refusal of a multi-key call whose slot is being moved
// and whose keys are not all on one side: the call did not run.
func isTryAgain(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "TRYAGAIN")
}
