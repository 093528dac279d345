package bucket

import (
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// Local evaluates the algorithms in process, with the formulas and rounding of the Lua
// scripts, for the limits whose fail mode keeps limiting while Redis is unreachable. Each
// process then limits on its own, so the effective limit is multiplied by the number of
// processes; that is the accepted price of staying available.
//
// State is keyed by Limit.Key. Entries expire when their Redis key would, and the number of
// keys is bounded: a full shard evicts expired entries first, else the one closest to
// expiring (the least state lost). Local is safe for concurrent use.
type Local struct {
	seed     maphash.Seed
	perShard int
	shards   []localShard
}

type localShard struct {
	mu sync.Mutex
	m  map[string]*state
	_  [48]byte // keeps neighbouring shard locks off one cache line
}

// defaultMaxKeys is NewLocal's bound when given 0: a few hundred bytes per key keeps it
// within a few hundred MiB in the worst case.
const defaultMaxKeys = 1 << 20

// evictSample is how many entries a full shard looks at to choose a victim.
const evictSample = 8

// NewLocal returns a Local holding at most about maxKeys keys (0 means 1<<20). A request may
// push a shard past its share by its own keys, which are never evicted while it runs.
func NewLocal(maxKeys int) *Local {
	if maxKeys <= 0 {
		maxKeys = defaultMaxKeys
	}
	// Fewer shards for small bounds, so that each shard's share stays meaningful.
	n := 64
	for n > 1 && maxKeys/n < 16 {
		n /= 2
	}
	l := &Local{seed: maphash.MakeSeed(), perShard: maxKeys / n, shards: make([]localShard, n)}
	for i := range l.shards {
		l.shards[i].m = make(map[string]*state)
	}
	return l
}

// Check evaluates req at now and, unless Peek, charges Cost to every limit if all of them
// allow, or to every limit whatever they answer when Count. IdempotencyKey is ignored: a
// process-local retry is not worth the memory. An invalid request (see Request.Validate) is
// denied. A now earlier than a bucket's last update counts as that update's time, so a clock
// stepping back never refills a bucket.
func (l *Local) Check(now time.Time, req Request) Result {
	reqs, res := [1]Request{req}, [1]Result{}
	l.decide(now, reqs[:], res[:])
	return res[0]
}

// CheckAll decides reqs at one instant as one call of Store.Check does, with Check's rules
// per request: when a request that is neither Peek nor Shadow denies, no request stays
// charged but a denied counted one (Store refunds the others' charges). Replay decides
// recorded checks with it.
func (l *Local) CheckAll(now time.Time, reqs []Request) []Result {
	res := make([]Result, len(reqs))
	l.decide(now, reqs, res)
	return res
}

// decide is CheckAll into res, under the locks of every key of reqs at once.
func (l *Local) decide(now time.Time, reqs []Request, res []Result) {
	nowUS := float64(now.UnixMicro())
	m := 0
	for i := range reqs {
		m += len(reqs[i].Limits)
	}
	var shardBuf, lockBuf [8]int
	var outBuf [4]outcome
	var parBuf [4]params
	shardOf, locks := shardBuf[:0], lockBuf[:0]
	outs, ps := outBuf[:0], parBuf[:0]
	if m > len(outBuf) {
		outs, ps = make([]outcome, 0, m), make([]params, 0, m)
	}
	for i := range reqs {
		for j := range reqs[i].Limits {
			s := int(maphash.String(l.seed, reqs[i].Limits[j].Key) % uint64(len(l.shards)))
			shardOf = append(shardOf, s)
			locks = insertSorted(locks, s)
		}
	}
	// Locking in ascending shard order lets requests that share shards never deadlock.
	for _, s := range locks {
		l.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range locks {
			l.shards[s].mu.Unlock()
		}
	}()

	var validBuf [4]bool
	valid := validBuf[:0]
	denied := false
	lrs := make([]LimitResult, m) // one allocation for every request's results
	for i := range reqs {
		req := &reqs[i]
		valid = append(valid, req.Validate() == nil)
		res[i] = Result{Now: now, Allowed: valid[i], Limits: lrs[:len(req.Limits):len(req.Limits)]}
		lrs = lrs[len(req.Limits):]
		for j := range req.Limits {
			lim := &req.Limits[j]
			p := paramsOf(lim)
			var o outcome
			if valid[i] && lim.Algorithm.Remote() {
				// A balance's grants live in Redis only: Local denies it rather than guess.
				o = outcome{retry: p.window}
			} else if valid[i] {
				o = evaluate(lim.Algorithm, l.shards[shardOf[len(outs)]].lookup(lim.Key, lim.Algorithm, nowUS), p, nowUS, float64(req.Cost))
			}
			outs, ps = append(outs, o), append(ps, p)
			res[i].Allowed = res[i].Allowed && o.ok
			res[i].Limits[j].Allowed = o.ok // for Kept; commit fills the rest
		}
		denied = denied || !req.Peek && !req.Shadow && !res[i].Allowed
	}
	k := 0
	for i := range reqs {
		req := &reqs[i]
		if !valid[i] {
			for j := range res[i].Limits {
				res[i].Limits[j] = LimitResult{ResetAt: now, RetryAfter: max(req.Limits[j].Window, time.Second)}
			}
			k += len(req.Limits)
			continue
		}
		// A counted request (Count) commits every limit, a denied one's as if charged, and
		// reports an allowed one's after values, as call.lua's fields does in mode "6"; an
		// allowed request of a denied call is refunded, so it commits nothing.
		charged := res[i].Allowed && !req.Peek && (!denied || kept(reqs, res, i))
		count := req.Count && !req.Peek && !res[i].Allowed
		for j := range req.Limits {
			res[i].Limits[j] = l.commit(&outs[k], ps[k], &req.Limits[j], shardOf[k], req, float64(req.Cost), nowUS, charged, count)
			k++
		}
	}
}

// commit applies o, one limit's outcome, when charged (or counted) and returns its result.
func (l *Local) commit(o *outcome, p params, lim *Limit, shard int, req *Request, cost, nowUS float64, charged, count bool) LimitResult {
	lr := LimitResult{Allowed: o.ok}
	used, rem, reset, retry := o.used, o.rem, o.reset, 0.0
	if charged || count && o.ok {
		l.shards[shard].put(l, lim.Key, req.Limits, nowUS).apply(o, p)
		used, rem, reset = o.aused, o.arem, o.areset
	} else if !o.ok {
		if count {
			l.shards[shard].put(l, lim.Key, req.Limits, nowUS).apply(o, p)
		}
		retry = o.retry
		if cost > p.burst && retry < p.window {
			retry = p.window
		}
		retry = math.Max(retry, 1)
	}
	lr.Used, lr.Remaining = int64(used), int64(rem)
	lr.ResetAt = time.UnixMicro(int64(ceilUS(reset)))
	lr.RetryAfter = time.Duration(retry) * time.Microsecond
	if charged && o.ok {
		lr.Delay = queueDelay(lim, time.UnixMicro(int64(nowUS)), lr.ResetAt)
	}
	return lr
}

// insertSorted adds s to the ascending set locks.
func insertSorted(locks []int, s int) []int {
	i := 0
	for i < len(locks) && locks[i] < s {
		i++
	}
	if i < len(locks) && locks[i] == s {
		return locks
	}
	locks = append(locks, 0)
	copy(locks[i+1:], locks[i:])
	locks[i] = s
	return locks
}

// lookup returns the live state of key, or nil when it is missing, expired (a missing Redis
// key) or of another algorithm (Redis keys include the algorithm, so that is a new bucket).
func (sh *localShard) lookup(key string, alg algorithm.ID, now float64) *state {
	st := sh.m[key]
	if st == nil {
		return nil
	}
	if st.expires <= now {
		delete(sh.m, key)
		return nil
	}
	if st.alg != alg {
		return nil
	}
	return st
}

// put returns the state of key, creating it, and making room when the shard is full.
func (sh *localShard) put(l *Local, key string, inUse []Limit, now float64) *state {
	if st := sh.m[key]; st != nil {
		return st
	}
	if len(sh.m) >= l.perShard {
		sh.evict(inUse, now)
	}
	st := &state{}
	sh.m[key] = st
	return st
}

// evict removes the expired entries among a sample of the shard, or, when none is, the
// sampled entry that expires first. Map iteration starts at a random place, so the sample
// is spread over the shard at O(1) cost. Keys of the running request are kept.
func (sh *localShard) evict(inUse []Limit, now float64) {
	victim, soonest, seen, expired := "", math.Inf(1), 0, 0
	for k, st := range sh.m {
		if seen >= evictSample {
			break
		}
		if usedBy(inUse, k) {
			continue
		}
		seen++
		if st.expires <= now {
			delete(sh.m, k)
			expired++
			continue
		}
		if st.expires < soonest {
			victim, soonest = k, st.expires
		}
	}
	if expired == 0 && victim != "" {
		delete(sh.m, victim)
	}
}

func usedBy(lims []Limit, key string) bool {
	for i := range lims {
		if lims[i].Key == key {
			return true
		}
	}
	return false
}
