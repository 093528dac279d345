package loadgen

import (
	"fmt"
	"io"
	"os"
	"time"
)

// startProgress prints a line to w every second, over the same line when w is a terminal. The
// returned function stops it and ends the line. A nil w prints nothing.
func startProgress(w io.Writer, start, measureFrom time.Time, warm, measured *stats) (stop func()) {
	if w == nil {
		return func() {}
	}
	tty := isTerminal(w)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last uint64
		var lastPhase *stats
		printed := false
		for {
			select {
			case <-done:
				if printed && tty {
					fmt.Fprintln(w)
				}
				return
			case now := <-t.C:
				// The phase is the one the most of the last second was in.
				phase, label := measured, "bench "
				if now.Add(-time.Second / 2).Before(measureFrom) {
					phase, label = warm, "warmup"
				}
				if phase != lastPhase {
					last, lastPhase = 0, phase
				}
				answered := phase.allowed.Load() + phase.denied.Load()
				line := fmt.Sprintf("%s %4.0fs  %8d checks/s  p99 %7.3fms  errors %d",
					label, now.Sub(start).Seconds(), answered-last, phase.hist.quantileMs(0.99), phase.errors.Load())
				last = answered
				if tty {
					fmt.Fprintf(w, "\r%s\x1b[K", line)
				} else {
					fmt.Fprintln(w, line)
				}
				printed = true
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
