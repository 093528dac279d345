package checkertest

import (
	"fmt"
	"os"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// MainShared is redistest.MainShared for the packages that build engines, followed by a
// check that no bucket.Store outlived the tests: Engine.Close closes its Store, whose Close
// waits for its batching goroutines, so any left belong to an Engine or a Store a test never
// closed, and the run fails.
func MainShared(m interface{ Run() int }, s **redistest.Shared) int {
	code := redistest.MainShared(m, s)
	if n := proctest.Goroutines(batchLoop); code == 0 && n > 0 {
		fmt.Fprintf(os.Stderr, "checkertest: %d bucket batching goroutines still running after the tests: an Engine or a bucket.Store was not closed\n", n)
		code = 1
	}
	return code
}

// batchLoop is the frame of a bucket.Store's batching goroutine.
const batchLoop = "bucket.(*batcher).loop("
