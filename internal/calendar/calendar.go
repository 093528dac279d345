// Package calendar gives the periods of calendar quotas: days, weeks, months and years that
// begin at local midnight in a time zone, so that "10,000 calls a month" resets when the
// customer's month does, however long that month and its days are (a DST day has 23 or 25
// hours). Months may begin on an anchor day, a customer's billing day.
//
// The periods are computed from a clock that may be off (a checker's); Around hands the two
// periods a reading off by less than half a period can be in to whoever holds the true clock
// (the Lua script, on Redis's), which picks between them.
package calendar

import (
	"errors"
	"fmt"
	"time"
)

// Unit is the length of a calendar period.
type Unit uint8

// The units. A week begins on Monday (ISO 8601); a month on its anchor day; a year on 1 January.
const (
	Day Unit = iota + 1
	Week
	Month
	Year
)

// units are the windows of a rules file that name a calendar unit, and what each is nominally.
var units = [...]struct {
	window  string
	nominal time.Duration
}{
	Day:   {"1d", 24 * time.Hour},
	Week:  {"1w", 7 * 24 * time.Hour},
	Month: {"1mo", 30 * 24 * time.Hour},
	Year:  {"1y", 365 * 24 * time.Hour},
}

// ParseUnit returns the unit of a calendar window: 1d, 1w, 1mo or 1y; ok is false for any
// other string (a duration such as 24h is no calendar window).
func ParseUnit(window string) (u Unit, ok bool) {
	for u := Day; u <= Year; u++ {
		if units[u].window == window {
			return u, true
		}
	}
	return 0, false
}

// Valid reports whether u is one of the units.
func (u Unit) Valid() bool { return u >= Day && u <= Year }

// String returns the unit as a window of a rules file: "1d", "1w", "1mo" or "1y".
func (u Unit) String() string {
	if u.Valid() {
		return units[u].window
	}
	return fmt.Sprintf("unit(%d)", uint8(u))
}

// Nominal is the unit's usual length (a month counts 30 days, a year 365), for what needs one
// duration: sizing, displays. A period's real length comes from Period.
func (u Unit) Nominal() time.Duration {
	if u.Valid() {
		return units[u].nominal
	}
	return 0
}

// MaxAnchorDay is the latest anchor day of a month; a month without that day begins on its last.
const MaxAnchorDay = 31

// ErrAnchor is an anchor day out of range, or one given to a unit other than Month.
var ErrAnchor = errors.New("calendar: an anchor day is a day of the month, 1 to 31, for monthly periods only")

// Period is how a calendar quota's time is cut: into Unit-long periods beginning at midnight in
// Location (nil means UTC), months on AnchorDay (0 means 1).
type Period struct {
	Unit      Unit
	Location  *time.Location
	AnchorDay int
}

// Validate reports a Period that cannot cut time: an invalid unit or anchor day.
func (p Period) Validate() error {
	switch {
	case !p.Unit.Valid():
		return fmt.Errorf("calendar: invalid unit %d", uint8(p.Unit))
	case p.AnchorDay < 0 || p.AnchorDay > MaxAnchorDay || (p.AnchorDay > 1 && p.Unit != Month):
		return ErrAnchor
	}
	return nil
}

func (p Period) loc() *time.Location {
	if p.Location == nil {
		return time.UTC
	}
	return p.Location
}

// Start returns the beginning of the period that holds t.
func (p Period) Start(t time.Time) time.Time {
	t = t.In(p.loc())
	y, m, d := t.Date()
	switch p.Unit {
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		return p.midnight(y, m, d-back)
	case Month:
		s := p.monthStart(y, m)
		if t.Before(s) {
			s = p.monthStart(y, m-1)
		}
		return s
	case Year:
		return p.midnight(y, time.January, 1)
	}
	return p.midnight(y, m, d)
}

// Next returns the beginning of the period after the one that holds t.
func (p Period) Next(t time.Time) time.Time {
	s := p.Start(t).In(p.loc())
	y, m, d := s.Date()
	switch p.Unit {
	case Week:
		return p.midnight(y, m, d+7)
	case Month:
		// s's month is the period's: its anchor day, or the last day of a shorter month.
		return p.monthStart(y, m+1)
	case Year:
		return p.midnight(y+1, time.January, 1)
	}
	return p.midnight(y, m, d+1)
}

// midnight is the first instant of the given (normalised) date in p's location: 00:00, or,
// where the clocks skip midnight (America/Santiago's DST begins at 24:00), the instant they
// skip to. time.Date then picks an instant before the change, of the day before, so the change
// is searched for, to the second, in the hours after it.
func (p Period) midnight(y int, m time.Month, d int) time.Time {
	loc := p.loc()
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // the date, normalised
	before := func(u time.Time) bool {
		y, m, d := u.In(loc).Date()
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Before(day)
	}
	if !before(t) {
		return t
	}
	lo, hi := t, t.Add(4*time.Hour) // no zone skips more than a few hours
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2)
		if before(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi.Truncate(time.Second)
}

// monthStart is the beginning of the period of month m of year y (normalised): its anchor
// day, or its last day when it has no such day.
func (p Period) monthStart(y int, m time.Month) time.Time {
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) // normalises y and m
	y, m = first.Year(), first.Month()
	day := max(p.AnchorDay, 1)
	last := first.AddDate(0, 1, -1).Day()
	return p.midnight(y, m, min(day, last))
}

// Span is two consecutive periods: the first begins at Start and lasts First, the second
// follows it and lasts Second.
type Span struct {
	Start         time.Time
	First, Second time.Duration
}

// End is when the second period ends.
func (s Span) End() time.Time { return s.Start.Add(s.First + s.Second) }

// Around returns the periods a true clock may be in when a clock that reads now is off by less
// than half a period: the period holding now and, in its second half, the next one, else the
// previous one.
func (p Period) Around(now time.Time) Span {
	start, next := p.Start(now), p.Next(now)
	if now.Sub(start) >= next.Sub(now) {
		return Span{Start: start, First: next.Sub(start), Second: p.Next(next).Sub(next)}
	}
	prev := p.Start(start.Add(-time.Nanosecond))
	return Span{Start: prev, First: start.Sub(prev), Second: next.Sub(start)}
}
