package proctest

import (
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Main is the body of a helper package's TestMain helper: it starts a server, sets *srv, runs
// the tests and closes the server. If the server does not start, it prints why, prefixed with
// name, and fails the run.
func Main[S interface{ Close() }](
	name string, m interface{ Run() int }, srv *S, start func() (S, error),
) int {
	s, err := start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	*srv = s
	defer s.Close()
	return m.Run()
}

// Goroutines counts the goroutines of this process whose stack holds frame, e.g.
// "bucket.(*batcher).loop(": what a test main checks for goroutines that outlive the tests.
func Goroutines(frame string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), frame)
		}
		buf = make([]byte, 2*len(buf))
	}
}
