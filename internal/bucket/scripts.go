package bucket

import (
	"embed"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaOrder is the concatenation order of a script with the given driver: the prelude defines
// the helpers, need.lua reads which algorithms the call or batch uses, each algorithm's module
// (lua/<name>.lua, in the order of the algorithms table) defines its <code>_eval, _commit and
// _refund, call.lua defines check(KEYS, ARGV) on top of them, and the driver runs it: once
// (check.lua) or per call of a batch (batch.lua).
func luaOrder(driver string) []string {
	order := []string{"prelude.lua", "need.lua"}
	for a := range eachAlgorithm {
		order = append(order, algorithms[a].name+".lua")
	}
	return append(order, "call.lua", driver)
}

// The first lines of the two scripts. The batch script's shebang (Redis 7.0 and later) lets
// one run touch keys of several cluster slots, all on the node it runs on (lua/batch.lua);
// the check script keeps the defaults of a script without one.
const (
	checkHead = "local BATCH = false\n"
	batchHead = "#!lua flags=allow-cross-slot-keys\nlocal BATCH = true\n"
)

// checkSource is the script of one call; see lua/call.lua for its contract.
var checkSource = mustConcat(checkHead, "check.lua")

// batchSource is the script of many calls in one run; see lua/batch.lua.
var batchSource = mustConcat(batchHead, "batch.lua")

// checkScript and batchScript carry the sources and their SHA1s for EVALSHA.
var (
	checkScript = redis.NewScript(checkSource)
	batchScript = redis.NewScript(batchSource)
)

func mustConcat(head, driver string) string {
	var b strings.Builder
	b.WriteString(head)
	for _, name := range luaOrder(driver) {
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
