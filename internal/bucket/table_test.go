package bucket

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// TestAlgorithmTable checks the algorithms table against the Lua files it names: a module per
// algorithm defining the functions call.lua dispatches to, built only when a limit uses its
// code; call.lua's dispatch covering exactly the table's codes; and no module outside it.
func TestAlgorithmTable(t *testing.T) {
	t.Parallel()
	names, codes := map[string]algorithm.ID{}, map[string]algorithm.ID{}
	for a := range algorithm.All {
		t.Run(a.String(), func(t *testing.T) {
			code := a.Code()
			if hasTwin := int(a) < len(evals) && evals[a] != nil; hasTwin == a.Remote() {
				t.Fatalf("algorithm %d: Go twin (evals) %v, want one unless it is remote", a, hasTwin)
			}
			if got, err := algorithm.Parse(a.String()); a.Remote() && err == nil {
				t.Errorf("algorithm.Parse(%q) = %v: rules files must not name a remote algorithm", a.String(), got)
			} else if !a.Remote() && (err != nil || (got != a) != a.Derived()) {
				t.Errorf("algorithm.Parse(%q): got %v, %v; want %v (or, for a derived one, another)", a.String(), got, err, a)
			}
			src, err := luaFiles.ReadFile("lua/" + a.Module() + ".lua")
			if err != nil {
				t.Fatalf("module: %v", err)
			}
			arg := strconv.Itoa(int(a))
			for _, want := range []string{
				fmt.Sprintf("local %[1]s_eval, %[1]s_commit, %[1]s_refund, %[1]s_charge\n", code),
				fmt.Sprintf("if NEED_1 == '%[1]s' or NEED and NEED['%[1]s'] then\n", arg),
				"function " + code + "_eval(",
				"function " + code + "_commit(",
				"function " + code + "_refund(",
			} {
				if !strings.Contains(string(src), want) {
					t.Errorf("lua/%s.lua: no %q", a.Module(), want)
				}
			}
			if charge := code + "_charge"; strings.Count(string(src), charge) > 1 && !strings.Contains(string(src), "function "+charge+"(") {
				t.Errorf("lua/%s.lua: names %s but does not define it", a.Module(), charge)
			}
		})
		if prev, ok := names[a.Module()]; ok {
			t.Errorf("module %q: both %d and %d", a.Module(), prev, a)
		}
		if prev, ok := codes[a.Code()]; ok {
			t.Errorf("code %q: both %d and %d", a.Code(), prev, a)
		}
		names[a.Module()], codes[a.Code()] = a, a
	}

	t.Run("call.lua", func(t *testing.T) {
		want := map[string]string{}
		for a := range algorithm.All {
			want[strconv.Itoa(int(a))] = a.Code()
		}
		if got := callDispatch(t); !maps.Equal(got, want) {
			t.Errorf("modules: got code → functions %v, want %v (the table)", got, want)
		}
	})

	t.Run("modules", func(t *testing.T) {
		entries, err := fs.ReadDir(luaFiles, "lua")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := strings.TrimSuffix(e.Name(), ".lua")
			if _, ok := names[name]; !ok && !slices.Contains(driverFiles, name) {
				t.Errorf("lua/%s: no algorithm of that name in the table", e.Name())
			}
		}
		for _, driver := range []string{"check.lua", "batch.lua"} {
			order := luaOrder(driver)
			if len(order) != len(names)+6 || order[0] != "prelude.lua" || order[1] != "need.lua" || order[2] != "shared.lua" ||
				order[len(order)-3] != dispatchName || order[len(order)-2] != "call.lua" || order[len(order)-1] != driver {
				t.Errorf("luaOrder(%q): got %v, want prelude.lua, need.lua, shared.lua, the %d modules, the dispatch, call.lua, %s", driver, order, len(names), driver)
			}
		}
	})
}

// driverFiles are the Lua files that are no algorithm's module.
var driverFiles = []string{"prelude", "need", "shared", "call", "check", "batch"}

// dispatchLine is one entry of MODULES, the dispatch on the algorithm code (dispatch).
var dispatchLine = regexp.MustCompile(`^if (\w+)_eval then MODULES\['(\d+)'\] = \{(\w+)_eval, (\w+)_commit, (\w+)_refund(?:, (\w+)_charge)?\} end$`)

// callDispatch returns the function prefix each code selects in MODULES (dispatch, the chunk
// before call.lua): the lines after its "local MODULES = {}".
func callDispatch(t *testing.T) map[string]string {
	t.Helper()
	src := dispatch()
	var got map[string]string
	for n, line := range strings.Split(src, "\n") {
		switch {
		case line == "local MODULES = {}":
			got = map[string]string{}
		case got != nil && line == "":
			return got
		case got != nil:
			m := dispatchLine.FindStringSubmatch(line)
			if m == nil || m[1] != m[3] || m[1] != m[4] || m[1] != m[5] || m[6] != "" && m[1] != m[6] {
				t.Fatalf("dispatch:%d: got %q, want `if <p>_eval then MODULES['<code>'] = {<p>_eval, <p>_commit, <p>_refund[, <p>_charge]} end`", n+1, line)
			}
			if _, dup := got[m[2]]; dup {
				t.Errorf("dispatch:%d: code %s dispatched twice", n+1, m[2])
			}
			got[m[2]] = m[1]
		}
	}
	t.Fatal("dispatch: no MODULES")
	return nil
}

// TestAlgorithmContract pins what the table's values are part of: rules files (names), Redis
// keys (codes) and the script's ARGV (codes as decimal values).
func TestAlgorithmContract(t *testing.T) {
	t.Parallel()
	want := []struct {
		alg        algorithm.ID
		name, code string
		burst      bool
	}{
		{algorithm.TokenBucket, "token_bucket", "tb", true},
		{algorithm.LeakyBucket, "leaky_bucket", "lb", true},
		{algorithm.FixedWindow, "fixed_window", "fw", false},
		{algorithm.SlidingWindowLog, "sliding_window_log", "swl", false},
		{algorithm.SlidingWindowCounter, "sliding_window_counter", "swc", false},
		{algorithm.GCRA, "gcra", "gcra", true},
		{algorithm.CalendarWindow, "fixed_window", "cw", false},
		{algorithm.Concurrency, "concurrency", "cc", false},
		{algorithm.Balance, "balance", "bl", false},
	}
	if got := slices.Collect(algorithm.All); len(got) != len(want) {
		t.Errorf("algorithms: got %v, want %d (a new one needs its row here)", got, len(want))
	}
	for _, w := range want {
		a := w.alg
		if a.String() != w.name || a.Code() != w.code || a.HasBurst() != w.burst || argCodes[a] != strconv.Itoa(int(a)) {
			t.Errorf("%d: got %q %q burst %v argv %v, want %q %q burst %v argv %d",
				a, a.String(), a.Code(), a.HasBurst(), argCodes[a], w.name, w.code, w.burst, a)
		}
	}
	const list = "token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter, gcra or concurrency"
	if _, err := algorithm.Parse("tokenbucket"); err == nil || err.Error() != `unknown algorithm "tokenbucket" (want `+list+")" {
		t.Errorf("algorithm.Parse(tokenbucket): got %v, want the list of names", err)
	}
}

// TestAlgorithmOutsideTable: a value past the table is refused by name, never indexed.
func TestAlgorithmOutsideTable(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	local := NewLocal(0)
	for _, a := range []algorithm.ID{0, algorithm.ID(len(evals)), 255} {
		t.Run(strconv.Itoa(int(a)), func(t *testing.T) {
			t.Parallel()
			if a.Valid() || a.HasBurst() || a.Code() != "invalid" || a.String() != fmt.Sprintf("algorithm(%d)", a) {
				t.Errorf("got valid %v burst %v code %q name %q, want an invalid algorithm", a.Valid(), a.HasBurst(), a.Code(), a.String())
			}
			req := one(lim(key(t, "x"), a, 5, time.Minute, 0), 1)
			_, err := s.Check(context.Background(), []Request{req})
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "invalid algorithm") {
				t.Errorf("Store.Check: got %v, want ErrInvalidRequest naming the algorithm", err)
			}
			if res := local.Check(time.Now(), req); res.Allowed {
				t.Errorf("Local.Check: allowed, want denied")
			}
		})
	}
}
