package bucket

import (
	"fmt"
	"strings"
)

// Algorithm is a rate-limiting algorithm.
type Algorithm uint8

// The algorithms. Their numeric values are part of the Lua contract (the ARGV algorithm code is
// the value in decimal), so they never change; each has its entry in algorithms.
const (
	TokenBucket Algorithm = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	GCRA
	// CalendarWindow is a fixed window over calendar periods (Limit.Periods): what a rule of
	// fixed_window with a calendar window (1d, 1w, 1mo, 1y) counts with. Rules files never name
	// it (ParseAlgorithm refuses it); its String is fixed_window's.
	CalendarWindow
	// Concurrency counts requests in flight: at most Limit places held at once, each from the
	// check that takes it (Limit.Holder) until Store.Release, or for Window when never
	// released.
	Concurrency
)

// algorithm is what tells one algorithm from another. Everything else that is per algorithm
// (the script's argument codes, the order of the Lua files, names, key codes) is derived from
// the algorithms table, so that adding one is adding an entry, not finding every list.
type algorithm struct {
	// name is the algorithm's name in rules files ("token_bucket"); its Lua module is
	// lua/<name>.lua.
	name string
	// code is its short name in Redis keys ("tb"), and the prefix of the functions its Lua
	// module defines and call.lua dispatches to: <code>_eval, <code>_commit, <code>_refund.
	code string
	// burst is whether it has a capacity distinct from its limit per window; window
	// algorithms count up to the limit.
	burst bool
	// eval is the Go twin of the Lua module's eval, for Local.
	eval func(s *state, p params, now, cost float64) outcome
	// module is the name of its Lua module, lua/<module>.lua, when it is not name.
	module string
	// derived marks an algorithm that rules files do not name: another's variant, chosen by
	// the rule's other fields.
	derived bool
	// holds marks an algorithm whose charges each take a place held until released
	// (Limit.Holder, Store.Release), one per check whatever its cost.
	holds bool
}

// algorithms is the one table of algorithms, indexed by Algorithm; entry 0 is none.
// TestAlgorithmTable checks it against the Lua files; docs/architecture.md ("Where to add")
// lists the steps of adding one.
var algorithms = [...]algorithm{
	TokenBucket:          {name: "token_bucket", code: "tb", burst: true, eval: evalTokenBucket},
	LeakyBucket:          {name: "leaky_bucket", code: "lb", burst: true, eval: evalLeakyBucket},
	FixedWindow:          {name: "fixed_window", code: "fw", eval: evalFixedWindow},
	SlidingWindowLog:     {name: "sliding_window_log", code: "swl", eval: evalSlidingLog},
	SlidingWindowCounter: {name: "sliding_window_counter", code: "swc", eval: evalSlidingCounter},
	GCRA:                 {name: "gcra", code: "gcra", burst: true, eval: evalGCRA},
	CalendarWindow:       {name: "fixed_window", code: "cw", eval: evalCalendarWindow, module: "calendar_window", derived: true},
	Concurrency:          {name: "concurrency", code: "cc", eval: evalConcurrency, holds: true},
}

// moduleName is a's Lua module: lua/<moduleName>.lua.
func (a Algorithm) moduleName() string {
	if m := algorithms[a].module; m != "" {
		return m
	}
	return algorithms[a].name
}

// eachAlgorithm yields every algorithm of the table, in its order.
func eachAlgorithm(yield func(Algorithm) bool) {
	for a := range algorithms {
		if Algorithm(a).Valid() && !yield(Algorithm(a)) {
			return
		}
	}
}

// algorithmList names the algorithms for ParseAlgorithm's error: "a, b or c".
var algorithmList = func() string {
	var names []string
	for a := range eachAlgorithm {
		if !algorithms[a].derived {
			names = append(names, a.String())
		}
	}
	last := len(names) - 1
	return strings.Join(names[:last], ", ") + " or " + names[last]
}()

// String returns the algorithm's name as written in rules files ("token_bucket").
func (a Algorithm) String() string {
	if a.Valid() {
		return algorithms[a].name
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Code returns the algorithm's short name used in Redis keys ("tb").
func (a Algorithm) Code() string {
	if a.Valid() {
		return algorithms[a].code
	}
	return "invalid"
}

// Valid reports whether a is one of the algorithms.
func (a Algorithm) Valid() bool { return int(a) < len(algorithms) && algorithms[a].name != "" }

// Holds reports whether the algorithm's charges take places held in flight (Concurrency): a
// check holds one per limit, whatever its cost, named by Limit.Holder, until Store.Release or
// its expiry.
func (a Algorithm) Holds() bool { return a.Valid() && algorithms[a].holds }

// HasBurst reports whether the algorithm has a capacity distinct from its limit per window
// (token bucket, leaky bucket, GCRA). Window algorithms count up to Limit.
func (a Algorithm) HasBurst() bool { return a.Valid() && algorithms[a].burst }

// ParseAlgorithm returns the algorithm named s ("token_bucket", "gcra", ...).
func ParseAlgorithm(s string) (Algorithm, error) {
	for a := range eachAlgorithm {
		if algorithms[a].name == s && !algorithms[a].derived {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want %s)", s, algorithmList)
}
