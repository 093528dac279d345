package webhook

import (
	"errors"
	"fmt"
	"time"
)

// Schedule is when a message whose delivery failed (and may mend) is tried again.
type Schedule struct {
	// Delays are the waits after the first failures, in order: Delays[0] after attempt 1.
	Delays []time.Duration
	// Every is the wait after each later failure; 0 makes the attempt after the last of
	// Delays the last.
	Every time.Duration
	// Span bounds the retries: no attempt is scheduled later than Span after the first, by
	// the sum of the waits before it (the real time is longer by the attempts' durations, a
	// receiver's Retry-After and any time no dispatcher ran).
	Span time.Duration
}

// DefaultSchedule retries for a day: quickly at first, for the receiver that blinked (a
// deploy, a restart), then less and less often, for the one that is down until someone
// fixes it, so that a day-long outage costs 13 attempts per message. The attempts are at
// 0, 5s, 35s, 2m35s, 12m35s, 42m35s, 1h42m, 3h42m, then every 4h until 23h42m; the next
// would pass the day, and the message is given up.
var DefaultSchedule = Schedule{
	Delays: []time.Duration{
		5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute,
		30 * time.Minute, time.Hour, 2 * time.Hour,
	},
	Every: 4 * time.Hour,
	Span:  24 * time.Hour,
}

// Next returns the wait after the failure of attempt n (1 for the first), and false when there
// is none: the next attempt would start more than Span after the first.
func (s Schedule) Next(n int) (time.Duration, bool) {
	if n < 1 {
		n = 1
	}
	var offset time.Duration // of attempt n+1 after attempt 1
	for i := 0; i < n && i < len(s.Delays); i++ {
		offset += s.Delays[i]
	}
	wait := s.Every
	if n <= len(s.Delays) {
		wait = s.Delays[n-1]
	} else if s.Every <= 0 || int64(n-len(s.Delays)) > int64(s.Span/s.Every) {
		return 0, false // also keeps the product below from overflowing
	} else {
		offset += time.Duration(n-len(s.Delays)) * s.Every
	}
	if offset > s.Span {
		return 0, false
	}
	return wait, true
}

// validate reports why s cannot schedule retries, or nil.
func (s Schedule) validate() error {
	if s.Span <= 0 {
		return errors.New("span must be positive")
	}
	for i, d := range s.Delays {
		if d <= 0 {
			return fmt.Errorf("delays[%d] %v: must be positive", i, d)
		}
	}
	if s.Every < 0 {
		return fmt.Errorf("every %v: must not be negative", s.Every)
	}
	return nil
}
