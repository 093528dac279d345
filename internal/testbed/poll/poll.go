// Package poll waits, in tests and test harnesses, for a condition that holds eventually: a row
// stored, a replica caught up, a server ready. It is the one place for how often a condition is
// looked at and for what a wait that gives up reports: what was awaited, for how long, and the
// condition's last error — a test that only says "timed out" leaves its reader to guess which
// of the things it waited for never happened, and why.
//
// A wait is bounded to turn a hang into a failure, not to assert a timing: give it a timeout
// that holds on a loaded CI machine.
package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

const (
	// minPause is the shortest pause between two looks: conditions held in memory (a counter, a
	// queue's state) usually hold within milliseconds, and a test — or a benchmark timing its
	// wait — should not oversleep them.
	minPause = time.Millisecond
	// maxPause caps the pause, which is a tenth of the time waited so far: a condition that
	// costs a query or a process (ClickHouse, quotaflow status, a browser) and takes seconds
	// to hold is then not asked many times a second on the shared CI cores.
	maxPause = 50 * time.Millisecond
)

// errFalse is the error of a condition of True that is still false.
var errFalse = errors.New("still false")

// Until calls cond until it returns nil, and fails t if timeout passes first, naming what it
// waited for and cond's last error.
func Until(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Wait(ctx, what, func(context.Context) error { return cond() }); err != nil {
		t.Fatalf("not within %s: %v", timeout, err)
	}
}

// Wait calls cond with ctx until it returns nil or ctx ends; then its error names what it
// waited for, and wraps ctx's error and cond's last error. It serves harnesses, which report
// errors rather than fail a test, and tests that wait within a context of their own.
func Wait(ctx context.Context, what string, cond func(ctx context.Context) error) error {
	start := time.Now()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last: %w)", what, ctx.Err(), err)
		case <-time.After(min(max(time.Since(start)/10, minPause), maxPause)):
		}
	}
}

// True adapts a condition with no error to tell to Until and Wait: while it is false, its
// error says so.
func True(cond func() bool) func() error {
	return func() error {
		if !cond() {
			return errFalse
		}
		return nil
	}
}
