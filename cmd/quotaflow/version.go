package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/quotaflow/quotaflow/internal/app/report"
)

func runVersion(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "Prints the version of quotaflow's module, the VCS revision it was built from when known, and the Go version.", stderr)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	bi, _ := debug.ReadBuildInfo()
	_, err := fmt.Fprintln(stdout, report.Version(bi))
	return err
}
