package loadgen

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// newSleeper returns a sleep function backed by a timerfd in Go's poller: the goroutine parks
// until the kernel's high-resolution timer fires, holding no thread, and wakes within tens of
// microseconds where a Go timer wakes up to a millisecond late.
func newSleeper() (sleep func(time.Duration) error, closeFn func() error, err error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("timerfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pacer-timerfd") // non-blocking: read parks in the poller
	var buf [8]byte
	sleep = func(d time.Duration) error {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(int64(d), 1))}
		if err := unix.TimerfdSettime(fd, 0, &spec, nil); err != nil {
			return fmt.Errorf("timerfd: %w", err)
		}
		_, err := f.Read(buf[:])
		return err
	}
	return sleep, f.Close, nil
}
