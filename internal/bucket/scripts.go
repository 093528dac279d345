package bucket

import (
	"embed"
	"errors"
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

// checkSource is the one script every check runs; see lua/check.lua for its contract.
var checkSource = mustConcat()

// checkScript carries the source and its SHA1 for EVALSHA.
var checkScript = redis.NewScript(checkSource)

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
