package checkertest

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/quotaflow/quotaflow/internal/redistest"
)

// MainShared is redistest.MainShared for the packages that build engines, followed by a
// check that no bucket.Store outlived the tests: Engine.Close closes its Store, whose Close
// waits for its batching goroutines, so any left belong to an Engine or a Store a test never
// closed, and the run fails.
func MainShared(m interface{ Run() int }, s **redistest.Shared) int {
	code := redistest.MainShared(m, s)
	if n := storeLoops(); code == 0 && n > 0 {
		fmt.Fprintf(os.Stderr, "checkertest: %d bucket batching goroutines still running after the tests: an Engine or a bucket.Store was not closed\n", n)
		code = 1
	}
	return code
}

// storeLoops counts the goroutines running a bucket.Store's batch loop.
func storeLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "bucket.(*batcher).loop(")
		}
		buf = make([]byte, 2*len(buf))
	}
}
