package bucket

import (
	"embed"
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaOrder is the concatenation order of the check script: the prelude defines the helpers,
// each algorithm's module (lua/<name>.lua, in the order of the algorithms table) defines its
// <code>_eval, _commit and _refund, and the driver, check.lua, dispatches to them and runs.
func luaOrder() []string {
	order := []string{"prelude.lua"}
	for a := range eachAlgorithm {
		order = append(order, algorithms[a].name+".lua")
	}
	return append(order, "check.lua")
}

// script is the check script of one Layout, with its SHA1 and source boxed once as go-redis
// arguments (boxing a string into an interface allocates).
type script struct {
	*redis.Script
	sha, src any
}

// checkScripts holds the one script every check runs (see lua/check.lua for its contract),
// per Layout: the same files after a first line that sets the chunk-level constant COMPACT,
// which the algorithm modules with two layouts read.
var checkScripts = func() (s [layouts]*script) {
	for l := range layouts {
		src := "local COMPACT = " + strconv.FormatBool(l == LayoutCompact) + "\n" + mustConcat()
		s[l] = &script{Script: redis.NewScript(src), src: src}
		s[l].sha = s[l].Hash()
	}
	return s
}()

func mustConcat() string {
	var b strings.Builder
	for _, name := range luaOrder() {
		src, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			// The files are embedded at build time, so this is a build defect, not input.
			panic("bucket: missing embedded script " + name)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}

// isNoScript reports whether err means the server does not have the script cached (after
// SCRIPT FLUSH, a restart or a failover). In a pipeline the raw server error arrives
// unnormalised, so both forms are accepted.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
