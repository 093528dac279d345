package checker

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaflow/quotaflow/internal/bucket"
)

// allotter is what a store that can allotment offers: *bucket.Store. A store without it (the fault
// injecting stores of this package's tests) decides allotted rules as ordinary ones.
type allotter interface {
	Allot(ctx context.Context, l bucket.Limit, want int64) (bucket.Allotment, error)
	GiveBack(ctx context.Context, l bucket.Limit, window, units int64) (int64, error)
}

var _ allotter = (*bucket.Store)(nil)

// allotments decides the checks of allotted rules (rules.Rule.Lease: global fixed_window rules)
// from slices of their windows allotted from Redis, so that a key every check shares costs Redis
// one script call per slice instead of one per check.
//
// It never admits more than the limit in any window, over any number of checkers. A slice is
// taken by one script call (bucket.Store.Allot) that counts its units in the window's counter
// as a charge would, all of them at once and never past the limit: the units of every slice of
// a window, allotted by any checker, plus its ordinary charges, are at most the limit. A checker
// admits a check only with units of its slice, each unit once (taken under the allotment's mutex),
// and gives back to Redis only units it has taken out of use first. So the checks admitted in a
// window are at most the units allotted in it, provided every one of them is admitted within that
// window. The slice is used only until an instant on this process's monotonic clock: the time
// the allotment call was sent plus what Redis said was left of the window (Reset - Now). The call
// was sent no later than Redis read its clock, so that instant is no later than the window's
// end: latency can only shorten a slice's life, never stretch it into the next window (the
// argument of overLimitCache). A grant that names a later window than the slice held proves
// the old window over: the old slice is dropped, never used. A checker killed (kill -9) with
// units in hand never gives them back: they are lost to that window, never admitted twice.
//
// It under-admits by a bounded amount: a checker holds at most max(slice, cost) units
// (refills ask for what tops the slice up, and one call is in flight per key at a time), so
// at most checkers × slice units of a window go unused, those of idle and killed checkers
// included. A window whose counter was spent is not asked again until its end (spent): units
// another checker gives back meanwhile are lost to this one, which errs towards denying.
//
// A slice is allotted under one limit and used only by checks under that limit: a key has one
// slice per effective limit (tier overrides give one global key several at once, which must
// not evict each other at every check). After a rule change (SetRules, which overrides and
// their expiry go through), the first check of a key under the new rules retires the key's
// slices of other limits, allotted under older rules: their unused units are given back to
// Redis by the next allotment call, before it allotments (so that a lowered limit finds them
// returned, not the window spent). A lowered limit thus admits no more than what was allotted
// before it and what it leaves; units already allotted under the old one count. A rule change
// that leaves a key's limit as it was keeps its slice.
type allotments struct {
	store allotter
	g     *guard
	log   *slog.Logger
	epoch time.Time
	tel   *instruments

	gen    atomic.Uint64 // the rule set's generation (bump)
	mu     sync.RWMutex  // every check reads m; new keys and limits write it
	m      map[allotmentKey]*allotment
	closed bool
	bg     sync.WaitGroup // refills and give-backs in the background
}

// allotmentKey names a slice: a bucket key and the limit it is allotted under.
type allotmentKey struct {
	key   string
	limit int64
}

// allotment is one key's slice in this process, under one limit.
type allotment struct {
	gen    atomic.Uint64 // the rule set's generation it was last looked up in
	mu     sync.Mutex
	limit  bucket.Limit // what the slice was allotted under
	wid    int64        // its window's id
	avail  int64        // units not yet used
	until  int64        // the slice is usable while now < until (ns since the table's epoch)
	spent  bool         // the window had nothing left at the last grant
	remain int64        // what the window had left for everyone at the last grant
	reset  time.Time    // the window's end on Redis's clock
	refill *refill      // the allotment call in flight, nil when none
	owed   []owed       // retired units, given back by the next allotment call before it allotments
}

// owed is units of a retired slice that go back to Redis.
type owed struct {
	limit      bucket.Limit
	wid, units int64
}

// refill is an allotment call in flight; done is closed once its grant is applied or it failed.
type refill struct {
	done chan struct{}
	ok   bool
}

// taken is a unit count taken from a slice for a check, to give back if the check is denied.
type taken struct {
	l     *allotment
	wid   int64
	units int64
}

func newAllotments(store allotter, g *guard, log *slog.Logger, tel *instruments) *allotments {
	return &allotments{store: store, g: g, log: log, epoch: time.Now(), tel: tel, m: make(map[allotmentKey]*allotment)}
}

func (t *allotments) now() int64 { return int64(time.Since(t.epoch)) }

// bump starts a new generation of rules: the next lookup of each key retires its slices of
// the limits the new rules no longer give it.
func (t *allotments) bump() { t.gen.Add(1) }

// get returns the slice of lim's key under lim's limit, made when there is none. The first
// lookup of a generation retires the key's slices of other limits from older generations
// into it, to be given back by its next allotment call.
func (t *allotments) get(lim bucket.Limit) *allotment {
	k := allotmentKey{lim.Key, lim.Limit}
	cur := t.gen.Load()
	t.mu.RLock()
	l, ok := t.m[k]
	t.mu.RUnlock()
	if ok && l.gen.Load() == cur {
		return l
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok = t.m[k]; !ok {
		l = &allotment{limit: lim}
		t.m[k] = l
	}
	l.gen.Store(cur)
	now := t.now()
	for ko, o := range t.m {
		if ko.key != lim.Key || ko.limit == lim.Limit || o.gen.Load() >= cur {
			continue
		}
		delete(t.m, ko)
		o.mu.Lock()
		t.retireLocked(o, now)
		ow := o.owed
		o.owed = nil
		o.mu.Unlock()
		if len(ow) > 0 {
			l.mu.Lock()
			// Asked again even if its window looked spent: the units go back first.
			l.owed, l.spent = append(l.owed, ow...), false
			l.mu.Unlock()
		}
	}
	return l
}

// take decides lim for a check of cost from this process's slice, allotting one when it has
// none or too little: decided false means it could not (Redis unavailable, the circuit open,
// ctx ended while waiting for another check's allotment call) and the limit is to be decided the
// ordinary way, by the store and its fail modes. Allowed, the units are taken: the caller
// gives them back (giveBack) if the check is denied by another limit.
func (t *allotments) take(ctx context.Context, lim bucket.Limit, slice, cost int64) (res bucket.LimitResult, tk taken, decided bool) {
	l := t.get(lim)
	for {
		now := t.now()
		l.mu.Lock()
		live := now < l.until
		switch {
		case live && l.avail >= cost:
			l.avail -= cost
			res = l.result(true, now)
			tk = taken{l: l, wid: l.wid, units: cost}
			var rf *refill
			var want int64
			var ow []owed
			if l.refill == nil && !l.spent && l.avail*2 < slice {
				// Topped up before it runs dry, so that checks rarely wait for an allotment call.
				rf, want, ow = &refill{done: make(chan struct{})}, slice-l.avail, l.owed
				l.refill, l.owed = rf, nil
			}
			l.mu.Unlock()
			if rf != nil {
				t.bg.Add(1)
				go func() {
					defer t.bg.Done()
					t.allot(l, lim, want, rf, ow)
				}()
			}
			return res, tk, true
		case live && l.spent:
			res = l.result(false, now)
			l.mu.Unlock()
			return res, taken{}, true
		case l.refill == nil:
			if t.g.circuit.open() {
				l.mu.Unlock()
				return res, taken{}, false
			}
			want := max(slice, cost)
			if live {
				want -= l.avail
			}
			rf, ow := &refill{done: make(chan struct{})}, l.owed
			l.refill, l.owed = rf, nil
			l.mu.Unlock()
			t.bg.Add(1)
			go func() {
				defer t.bg.Done()
				t.allot(l, lim, want, rf, ow)
			}()
			if !t.wait(ctx, rf) {
				return res, taken{}, false
			}
		default:
			rf := l.refill
			l.mu.Unlock()
			if !t.wait(ctx, rf) {
				return res, taken{}, false
			}
		}
	}
}

// wait waits for the allotment call rf, at most the store's timeout (a check's bound on a store
// call) and while ctx lasts, and reports whether it succeeded in time. A check that stops
// waiting goes to the store; the call goes on, and its grant serves the checks after it.
func (t *allotments) wait(ctx context.Context, rf *refill) bool {
	timer := time.NewTimer(t.g.timeout)
	defer timer.Stop()
	select {
	case <-rf.done:
		return rf.ok
	case <-ctx.Done():
	case <-timer.C:
	}
	return false
}

// callTimeout bounds an allotment or give-back call. Like a batch's (minBatchTimeout), it is longer
// than a check waits: no check is bound by it, and a process starved of CPU that reads the
// reply late must not lose the units it was granted.
func (t *allotments) callTimeout() time.Duration { return max(t.g.timeout, minBatchTimeout) }

// allot gives back ow, then runs one allot call of want units for l and applies its grant; it
// reports whether the call succeeded. The calls have deadlines of their own, not a check's:
// the grant is for every check of the key, and a grant nobody applies is lost to the window.
// They tell the circuit nothing: a allot that fails sends its checks to the store, whose
// batcher reports the outcome of its round trips, and the circuit it opens stops the allotments.
func (t *allotments) allot(l *allotment, lim bucket.Limit, want int64, rf *refill, ow []owed) bool {
	for _, o := range ow {
		t.giveBackNow(o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.callTimeout())
	sentAt := t.now()
	g, err := t.store.Allot(ctx, lim, want)
	cancel()
	if err != nil {
		t.log.Warn("leasing a slice failed; its checks go to the store", "key", lim.Key, "err", err)
	} else {
		t.tel.allotUnits.Add(context.Background(), g.Units)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refill = nil
	rf.ok = err == nil
	close(rf.done)
	if err != nil {
		return false
	}
	until := sentAt + int64(g.Reset.Sub(g.Now))
	now := t.now()
	switch {
	case now < l.until && g.Window == l.wid:
		l.avail += g.Units
		l.until = max(l.until, until)
	case now < l.until && g.Window < l.wid:
		// A grant of a window older than the slice held: it cannot be used now. Not
		// reached while one call is in flight per key; kept for the argument's sake.
		return true
	default:
		// A new window, or none was live: a grant of a later window than the slice proves
		// that slice's window over on Redis, so its units are dropped, never used.
		l.wid, l.avail, l.until = g.Window, g.Units, until
	}
	l.spent, l.remain, l.reset = g.Remaining == 0, g.Remaining, g.Reset
	return true
}

// result describes l's window to a check at now: what this process knows is left is its own
// slice and what the window had left for everyone at the last grant.
func (l *allotment) result(allowed bool, now int64) bucket.LimitResult {
	left := l.avail + l.remain
	res := bucket.LimitResult{Allowed: allowed, Used: max(0, l.limit.Limit-left), Remaining: left, ResetAt: l.reset}
	if !allowed {
		res.RetryAfter = max(time.Duration(l.until-now), time.Microsecond)
	}
	return res
}

// giveBack returns units taken for a check that was denied to their slice, while its window
// lasts; after that they are lost with it. They were never admitted.
func (t *allotments) giveBack(tk taken) {
	if tk.l == nil {
		return
	}
	l := tk.l
	l.mu.Lock()
	if l.wid == tk.wid && t.now() < l.until && l.limit.Limit > 0 {
		l.avail += tk.units
	}
	l.mu.Unlock()
}

// retireLocked takes l's slice out of use; its units are owed to Redis. l.mu is held.
func (t *allotments) retireLocked(l *allotment, now int64) {
	if now < l.until && l.avail > 0 {
		l.owed = append(l.owed, owed{limit: l.limit, wid: l.wid, units: l.avail})
	}
	l.avail, l.until, l.spent = 0, 0, false
}

// giveBackNow gives o back to Redis; a failure loses its units to their window.
func (t *allotments) giveBackNow(o owed) {
	ctx, cancel := context.WithTimeout(context.Background(), t.callTimeout())
	defer cancel()
	n, err := t.store.GiveBack(ctx, o.limit, o.wid, o.units)
	if err != nil {
		t.log.Warn("giving back an allotment failed; its units are lost to the window", "key", o.limit.Key, "units", o.units, "err", err)
		return
	}
	t.tel.allotReturned.Add(context.Background(), n)
}

// forget drops the slices of keys without giving them back (a reset deletes their buckets):
// the next checks allotment from the reset counter. Other checkers keep the slices they hold
// until their window ends, at most a slice each on top of the reset window's limit.
func (t *allotments) forget(keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, l := range t.m {
		if !slices.Contains(keys, k.key) {
			continue
		}
		delete(t.m, k)
		l.mu.Lock()
		l.avail, l.until, l.spent, l.owed = 0, 0, false, nil
		l.mu.Unlock()
	}
}

// close gives every slice back to Redis, once the calls in the background are done (each
// within the store's timeout): a checker that stops leaves its unused units to the others.
// Checks must not be in flight.
func (t *allotments) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.mu.Unlock()
	t.bg.Wait()
	now := t.now()
	var ow []owed
	t.mu.RLock()
	for _, l := range t.m {
		l.mu.Lock()
		t.retireLocked(l, now)
		ow = append(ow, l.owed...)
		l.owed = nil
		l.mu.Unlock()
	}
	t.mu.RUnlock()
	for _, o := range ow {
		t.giveBackNow(o)
	}
}
