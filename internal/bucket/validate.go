package bucket

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// maxValue bounds costs, limits, bursts and windows (in µs) so that every computation in the
// Lua script, which only has doubles, stays exact.
const maxValue = 1 << 50

// ErrInvalidRequest is wrapped by every error of Request.Validate: the request is wrong, not
// the Redis behind it.
var ErrInvalidRequest = errors.New("invalid bucket request")

var (
	errNoLimits  = errors.New("no limits")
	errCostRange = fmt.Errorf("cost must be between 1 and %d", int64(maxValue))
	// A counted request is denied and charged alike: a retry of one is another hit, as it
	// is to the reference service.
	errCountRecord    = errors.New("a counted request cannot carry an idempotency record")
	errCountAlgorithm = errors.New("only fixed window limits can be counted")
	// Only an observed request may stand in for an enforced limit: an enforced one that kept
	// its charge through a denial would charge a denied check.
	errReplacesShadow = errors.New("only a shadow request replaces a limit")
)

// Validate reports the first reason r cannot be checked, or nil; the error wraps
// ErrInvalidRequest. Store.Check returns it as an error; Local.Check denies such a request.
func (r *Request) Validate() error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

func (r *Request) validate() error {
	if r.Cost < 1 || r.Cost > maxValue {
		return fmt.Errorf("%w, got %d", errCostRange, r.Cost)
	}
	if len(r.Limits) == 0 {
		return errNoLimits
	}
	if r.Count && r.IdempotencyKey != "" {
		return errCountRecord
	}
	if r.Replaces != "" && !r.Shadow {
		return errReplacesShadow
	}
	for i := range r.Limits {
		if r.Count && r.Limits[i].Algorithm != algorithm.FixedWindow {
			return fmt.Errorf("limit %d (%q): %w", i, r.Limits[i].Key, errCountAlgorithm)
		}
		if err := r.Limits[i].validate(); err != nil {
			return fmt.Errorf("limit %d (%q): %w", i, r.Limits[i].Key, err)
		}
		for j := 0; j < i; j++ {
			// Two limits on one key would both be evaluated on the old state and the second
			// write would silently discard the first charge.
			if r.Limits[j].Key == r.Limits[i].Key {
				return fmt.Errorf("limit %d (%q): same key as limit %d", i, r.Limits[i].Key, j)
			}
		}
	}
	return nil
}

func (l *Limit) validate() error {
	switch {
	case l.Key == "":
		return errors.New("empty key")
	case !l.Algorithm.Valid():
		return fmt.Errorf("invalid algorithm %d", uint8(l.Algorithm))
	case l.Limit == 0 && l.Algorithm == algorithm.FixedWindow:
		// A fixed window of 0 denies every charge: Envoy's "banned" limits.
	case l.Limit < 1 || l.Limit > maxValue:
		return fmt.Errorf("limit must be between 1 and %d (0 for a fixed window), got %d", int64(maxValue), l.Limit)
	case l.Window < time.Microsecond || l.Window.Microseconds() > maxValue:
		return fmt.Errorf("window must be between 1µs and %v, got %v", time.Duration(maxValue)*time.Microsecond, l.Window)
	case l.Burst < 0 || l.Burst > maxValue:
		return fmt.Errorf("burst must be between 0 and %d, got %d", int64(maxValue), l.Burst)
	case l.MaxDelay < 0 || l.MaxDelay.Microseconds() > maxValue:
		return fmt.Errorf("max delay must be between 0 and %v, got %v", time.Duration(maxValue)*time.Microsecond, l.MaxDelay)
	case l.MaxDelay > 0 && l.Algorithm != algorithm.GCRA && l.Algorithm != algorithm.LeakyBucket:
		return fmt.Errorf("only gcra and leaky_bucket limits queue (max delay), not %s", l.Algorithm)
	case l.Algorithm == algorithm.CalendarWindow || l.Algorithm == algorithm.Balance:
		return l.validatePeriods()
	case l.Algorithm.Holds() && (l.Holder == "" || len(l.Holder) > MaxHolder):
		return fmt.Errorf("a concurrency limit needs a lease id of 1 to %d bytes, got %d", MaxHolder, len(l.Holder))
	}
	return nil
}

// MaxHolder bounds Limit.Holder.
const MaxHolder = 64

// maxPeriod bounds each calendar period of a algorithm.CalendarWindow: its length in seconds travels in
// 25 bits (lua/calendar_window.lua), which a leap year and a DST hour fill to 0.94.
const maxPeriod = (1<<25 - 1) * time.Second

func (l *Limit) validatePeriods() error {
	p := l.Periods
	switch {
	case p.Start.Unix() < 1 || p.Start.Nanosecond() != 0:
		return fmt.Errorf("calendar periods must start on a whole second after 1970, got %v", p.Start)
	case p.First < time.Second || p.First > maxPeriod || p.First%time.Second != 0 ||
		p.Second < time.Second || p.Second > maxPeriod || p.Second%time.Second != 0:
		return fmt.Errorf("calendar periods must each last whole seconds, 1s to %v, got %v and %v", maxPeriod, p.First, p.Second)
	}
	return nil
}

// windowUS is the window in whole µs, the unit of the Lua contract.
func (l *Limit) windowUS() int64 { return l.Window.Microseconds() }

// scriptArgs are the numbers the script gets in the places of a limit's window and burst:
// those, or the periods of a algorithm.CalendarWindow or a algorithm.Balance
// (lua/calendar_window.lua, lua/balance.lua).
func (l *Limit) scriptArgs() (w, b int64) {
	if l.Algorithm == algorithm.CalendarWindow || l.Algorithm == algorithm.Balance {
		p := l.Periods
		return p.Start.Unix(), int64(p.First/time.Second)<<25 | int64(p.Second/time.Second)
	}
	// A fixed window ignores its burst; the script wants one of at least 1.
	return l.windowUS(), max(l.Capacity(), 1)
}
