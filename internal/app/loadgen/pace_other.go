//go:build !linux

package loadgen

import "time"

// newSleeper returns time.Sleep where no timerfd exists: open-loop latency may then include up
// to a millisecond of the generator's own lateness.
func newSleeper() (func(time.Duration) error, func() error, error) {
	return func(d time.Duration) error { time.Sleep(d); return nil }, func() error { return nil }, nil
}
