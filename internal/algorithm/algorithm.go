// Package algorithm is the list of rate-limiting algorithms: their names in rules files, their
// codes in Redis keys and Lua functions, and what sets each apart. It is a leaf that the rule
// model (checker/rules) and the buckets (internal/bucket) both read, so that the rules name an
// algorithm without linking the store that runs it. Everything that is per algorithm is derived
// from its one table: adding an algorithm is a row here, its Lua module and its Go twin in
// internal/bucket (docs/architecture.md, "Where to add").
package algorithm

import (
	"fmt"
	"iter"
	"strings"
)

// ID is one algorithm. Its numeric value is part of the Lua contract (the ARGV algorithm code
// is the value in decimal), so it never changes.
type ID uint8

// The algorithms; each has its row in table.
const (
	TokenBucket ID = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	GCRA
	// CalendarWindow is a fixed window over calendar periods: what a rule of fixed_window with
	// a calendar window (1d, 1w, 1mo, 1y) counts with. Rules files never name it (Parse refuses
	// it); its String is fixed_window's.
	CalendarWindow
	// Concurrency counts requests in flight: at most the limit's places held at once, each
	// from the check that takes it until released, or for the window when never released.
	Concurrency
	// Balance is an entitlement's balance: grants that charges burn in order, per calendar
	// period (lua/balance.lua). Rules files never name it: entitlements declare it.
	Balance
)

// row is what tells one algorithm from another.
type row struct {
	// name is the algorithm's name in rules files ("token_bucket"); its Lua module is
	// lua/<name>.lua unless module says otherwise.
	name string
	// code is its short name in Redis keys ("tb"), and the prefix of the functions its Lua
	// module defines and call.lua dispatches to: <code>_eval, <code>_commit, <code>_refund.
	code string
	// burst is whether it has a capacity distinct from its limit per window; window
	// algorithms count up to the limit.
	burst bool
	// module is the name of its Lua module, lua/<module>.lua, when it is not name.
	module string
	// derived marks an algorithm that rules files do not name: another's variant, chosen by
	// the rule's other fields.
	derived bool
	// holds marks an algorithm whose charges each take a place held until released, one per
	// check whatever its cost.
	holds bool
	// remote marks an algorithm whose state lives only in Redis (a balance made of grants the
	// admin API wrote there): it has no Go twin, and Local never decides it.
	remote bool
}

// table is the one table of algorithms, indexed by ID; entry 0 is none. internal/bucket's
// TestAlgorithmTable checks it against the Lua files and the Go twins.
var table = [...]row{
	TokenBucket:          {name: "token_bucket", code: "tb", burst: true},
	LeakyBucket:          {name: "leaky_bucket", code: "lb", burst: true},
	FixedWindow:          {name: "fixed_window", code: "fw"},
	SlidingWindowLog:     {name: "sliding_window_log", code: "swl"},
	SlidingWindowCounter: {name: "sliding_window_counter", code: "swc"},
	GCRA:                 {name: "gcra", code: "gcra", burst: true},
	CalendarWindow:       {name: "fixed_window", code: "cw", module: "calendar_window", derived: true},
	Concurrency:          {name: "concurrency", code: "cc", holds: true},
	Balance:              {name: "balance", code: "bl", derived: true, remote: true},
}

// All yields every algorithm of the table, in its order (the order of the Lua modules).
func All(yield func(ID) bool) {
	for a := range table {
		if ID(a).Valid() && !yield(ID(a)) {
			return
		}
	}
}

var _ iter.Seq[ID] = All

// names lists the algorithms rules files name, for Parse's error: "a, b or c".
var names = func() string {
	var ns []string
	for a := range All {
		if !table[a].derived {
			ns = append(ns, a.String())
		}
	}
	last := len(ns) - 1
	return strings.Join(ns[:last], ", ") + " or " + ns[last]
}()

// Parse returns the algorithm a rules file names s ("token_bucket", "gcra", ...).
func Parse(s string) (ID, error) {
	for a := range All {
		if table[a].name == s && !table[a].derived {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want %s)", s, names)
}

// String returns the algorithm's name as written in rules files ("token_bucket").
func (a ID) String() string {
	if a.Valid() {
		return table[a].name
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Code returns the algorithm's short name used in Redis keys and Lua functions ("tb").
func (a ID) Code() string {
	if a.Valid() {
		return table[a].code
	}
	return "invalid"
}

// Module is the algorithm's Lua module: lua/<Module>.lua; empty for an ID that is no
// algorithm.
func (a ID) Module() string {
	if !a.Valid() {
		return ""
	}
	if m := table[a].module; m != "" {
		return m
	}
	return table[a].name
}

// Valid reports whether a is one of the algorithms.
func (a ID) Valid() bool { return int(a) < len(table) && table[a].name != "" }

// Derived reports whether a is a variant rules files do not name (CalendarWindow).
func (a ID) Derived() bool { return a.Valid() && table[a].derived }

// Holds reports whether the algorithm's charges take places held in flight (Concurrency): a
// check holds one per limit, whatever its cost, until released or expired.
func (a ID) Holds() bool { return a.Valid() && table[a].holds }

// HasBurst reports whether the algorithm has a capacity distinct from its limit per window
// (token bucket, leaky bucket, GCRA). Window algorithms count up to their limit.
func (a ID) HasBurst() bool { return a.Valid() && table[a].burst }

// Remote reports whether a's state lives only in Redis: it has no Go twin, and no fail mode
// decides it locally.
func (a ID) Remote() bool { return a.Valid() && table[a].remote }
