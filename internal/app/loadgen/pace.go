package loadgen

import (
	"context"
	"math"
	"time"
)

// pace sends the open loop's slots to out, each at its due time, from start until end or until
// ctx is done; then it closes out. A slot no worker is free to take waits in out, and its
// latency still counts from its due time.
//
// Go's timers wake up to a millisecond late (the poller's timeout has millisecond resolution),
// and the report bills a late send to the target, so pace sleeps on a timerfd where there is
// one (see newSleeper).
func pace(ctx context.Context, start, end time.Time, interval float64, out chan<- time.Time) {
	defer close(out)
	sleep, closeSleeper, err := newSleeper()
	if err != nil {
		sleep, closeSleeper = func(d time.Duration) error { time.Sleep(d); return nil }, func() error { return nil }
	}
	defer closeSleeper()
	for k := int64(0); ; k++ {
		at := slotTime(start, k, interval)
		if !at.Before(end) {
			return
		}
		for d := time.Until(at); d > 0; d = time.Until(at) {
			if ctx.Err() != nil {
				return
			}
			if err := sleep(min(d, 50*time.Millisecond)); err != nil {
				time.Sleep(d)
			}
		}
		select {
		case out <- at:
		case <-ctx.Done():
			return
		}
	}
}

// slotTime is when the open loop's check number k is due.
func slotTime(start time.Time, k int64, interval float64) time.Time {
	return start.Add(time.Duration(float64(k) * interval))
}

// slotsBefore is the number of the open loop's checks due before t.
func slotsBefore(start, t time.Time, interval float64) int64 {
	k := int64(math.Ceil(float64(t.Sub(start)) / interval))
	for k > 0 && !slotTime(start, k-1, interval).Before(t) {
		k--
	}
	for slotTime(start, k, interval).Before(t) {
		k++
	}
	return k
}
