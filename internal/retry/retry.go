// Package retry holds the waits of code that keeps trying until its context ends: a sleep that
// a cancelled context cuts short, an exponential backoff, and a loop that restarts a long-running
// task that stopped early.
package retry

import (
	"context"
	"log/slog"
	"time"
)

// Sleep waits for d or until ctx ends, and reports whether the whole of d passed, so that a
// caller can write `if !retry.Sleep(ctx, d) { return }`.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Backoff doubles a wait from Min up to Max. The zero value starts at 100ms and has no cap.
type Backoff struct {
	// Min is the first wait (100ms when 0); Max caps the waits (none when 0).
	Min, Max time.Duration
	cur      time.Duration
}

// Next returns the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0 && b.Min > 0:
		b.cur = b.Min
	case b.cur == 0:
		b.cur = 100 * time.Millisecond
	default:
		b.cur *= 2
	}
	if b.Max > 0 && b.cur > b.Max {
		b.cur = b.Max
	}
	return b.cur
}

// Reset starts the waits over from Min, after a success.
func (b *Backoff) Reset() { b.cur = 0 }

// Forever runs f until ctx ends, starting it again a second after it returns early; each early
// return is logged on log as "<what> stopped; restarting" with its error. It is for the tasks
// of a process that must run as long as the process does (a watch, a publisher of expiries).
func Forever(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) {
	for ctx.Err() == nil {
		err := f(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Warn(what+" stopped; restarting", "err", err)
		Sleep(ctx, time.Second)
	}
}
