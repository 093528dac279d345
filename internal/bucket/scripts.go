package bucket

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaOrder is the concatenation order of a script with the given driver: the prelude defines
// the helpers, need.lua reads which algorithms the call or batch uses, shared.lua reads and
// writes the fields of the shared hashes, each algorithm's module (lua/<name>.lua, in the
// order of the algorithms table) defines its <code>_eval, _commit and _refund, call.lua
// defines check(KEYS, ARGV) on top of them, and the driver runs it: once (check.lua) or per
// call of a batch (batch.lua).
func luaOrder(driver string) []string {
	order := []string{"prelude.lua", "need.lua", "shared.lua"}
	for a := range algorithm.All {
		order = append(order, a.Module()+".lua")
	}
	return append(order, dispatchName, "call.lua", driver)
}

// dispatchName stands in luaOrder for the dispatch, which is derived, not a file.
const dispatchName = "(dispatch)"

// dispatch is the chunk that defines call.lua's MODULES from the algorithm table: each
// algorithm's module functions under its code, when this run built its module (need.lua).
// Every module declares its four functions (local <code>_eval, _commit, _refund, _charge),
// _charge nil where it has none.
func dispatch() string {
	var b strings.Builder
	b.WriteString("local MODULES = {}\n")
	for a := range algorithm.All {
		c := a.Code()
		fmt.Fprintf(&b, "if %[1]s_eval then MODULES['%[2]d'] = {%[1]s_eval, %[1]s_commit, %[1]s_refund, %[1]s_charge} end\n", c, a)
	}
	return b.String()
}

// script is the check or batch script of one Layout, with its SHA1 and source boxed once as
// go-redis arguments (boxing a string into an interface allocates).
type script struct {
	*redis.Script
	sha, src any
}

// The first lines of the scripts. The batch script's shebang (Redis 7.0 and later; it must be
// the script's first line) lets one run touch keys of several cluster slots, all on the node it
// runs on (lua/batch.lua); the check script keeps the defaults of a script without one. Then
// the chunk-level constants: BATCH, which driver runs (need.lua), COMPACT, FIELDS and SHARED,
// the layout (layoutHead), and SHIFT, what the scripts add to Redis's time (0 but in tests:
// StoreConfig.ClockOffset).
const (
	checkHead = "local BATCH = false\nlocal LIBRARY = false\n"
	batchHead = "#!lua flags=allow-cross-slot-keys\nlocal BATCH = true\nlocal LIBRARY = false\n"
)

// checkScripts and batchScripts hold, per Layout, the script of one call (lua/call.lua gives
// its contract) and the script of many calls in one run (lua/batch.lua).
var checkScripts, batchScripts = scriptsOf(checkHead, "check.lua", 0), scriptsOf(batchHead, "batch.lua", 0)

// scriptsOf makes the scripts of each layout. shift is added to Redis's time
// (StoreConfig.ClockOffset): SHIFT in the script, in µs.
func scriptsOf(head, driver string, shift time.Duration) (s [layouts]*script) {
	for l := range layouts {
		src := head + layoutHead(l) +
			"local SHIFT = " + strconv.FormatInt(shift.Microseconds(), 10) + "\n" + mustConcat(driver)
		s[l] = newScript(src)
	}
	return s
}

// newScript returns the script of source src.
func newScript(src string) *script {
	s := &script{Script: redis.NewScript(src), src: src}
	s.sha = s.Hash()
	return s
}

// library is the batch function library of one Layout (lua/batch.lua, LIBRARY): the batch
// script's code, loaded once with FUNCTION LOAD, whose function FCALL runs per batch. Its name
// and its function's are those of its source ("qf_" and 16 hex digits of its SHA1), so that
// checkers of different versions (a rolling upgrade) each find their own in one Redis.
type library struct {
	name     string
	fn, src  any // the function's name and the library's source, boxed once
	loadArgs []any
}

// libraryTail registers a library's function. FUNCTION LOAD runs the library with no Lua
// library but redis.register_function in reach (not math, not string), so the code of the batch
// script is wrapped in build, which the first call runs: its locals, the modules and helpers,
// live on as the upvalues of CALL (lua/batch.lua).
const libraryTail = `redis.register_function{
  function_name = '%s',
  callback = function(_, argv)
    if not CALL then
      build()
    end
    return CALL(argv)
  end,
  flags = {'allow-cross-slot-keys'},
}
`

// batchLibraries holds, per Layout, the batch function library.
var batchLibraries = librariesOf(0)

// librariesOf makes the batch function libraries of each layout; shift is as for scriptsOf.
func librariesOf(shift time.Duration) (s [layouts]*library) {
	for l := range layouts {
		body := "local BATCH = true\nlocal LIBRARY = true\nlocal ARGV, CALL\n" +
			layoutHead(l) +
			"local SHIFT = " + strconv.FormatInt(shift.Microseconds(), 10) + "\n" +
			"local function build()\n" + mustConcat("batch.lua") + "end\n"
		sum := sha1.Sum([]byte(body))
		name := "qf_" + hex.EncodeToString(sum[:8])
		src := "#!lua name=" + name + "\n" + body + fmt.Sprintf(libraryTail, name)
		s[l] = &library{name: name, fn: name, src: src, loadArgs: []any{"function", "load", src}}
	}
	return s
}

// layoutHead is the scripts' lines of Layout l: COMPACT, whether the modules with two layouts
// write the compact one; FIELDS, whether its calls name shared hashes whose fields it reads
// (lua/shared.lua); SHARED, whether it writes buckets there.
func layoutHead(l Layout) string {
	return "local COMPACT = " + strconv.FormatBool(l != LayoutPrevious) + "\n" +
		"local FIELDS = " + strconv.FormatBool(l.fields()) + "\n" +
		"local SHARED = " + strconv.FormatBool(l == LayoutShared) + "\n"
}

func mustConcat(driver string) string {
	var b strings.Builder
	for _, name := range luaOrder(driver) {
		if name == dispatchName {
			b.WriteString(dispatch())
		} else {
			b.WriteString(mustRead(name))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// mustRead returns the embedded lua/<name>.
func mustRead(name string) string {
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		// The files are embedded at build time, so this is a build defect, not input.
		panic("bucket: missing embedded script " + name)
	}
	return string(src)
}

// isNoScript reports whether err means the server does not have the script cached (after
// SCRIPT FLUSH, a restart or a failover). In a pipeline the raw server error arrives
// unnormalised, so both forms are accepted.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
