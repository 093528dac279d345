package proctest

import (
	"fmt"
	"os"
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
