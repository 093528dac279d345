package calendar

import (
	"fmt"
	"testing"
	"time"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func TestPeriod(t *testing.T) {
	t.Parallel()
	berlin := mustLoad(t, "Europe/Berlin")
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name        string
		p           Period
		t           string
		start, next string
		length      time.Duration
	}{
		{"day", Period{Unit: Day, Location: berlin}, "2026-11-27 13:05", "2026-11-27 00:00", "2026-11-28 00:00", 24 * time.Hour},
		{"DST day of 23 hours", Period{Unit: Day, Location: berlin}, "2026-03-29 12:00", "2026-03-29 00:00", "2026-03-30 00:00", 23 * time.Hour},
		{"DST day of 25 hours", Period{Unit: Day, Location: berlin}, "2026-10-25 23:59", "2026-10-25 00:00", "2026-10-26 00:00", 25 * time.Hour},
		{"week from Monday", Period{Unit: Week, Location: berlin}, "2026-11-29 23:00", "2026-11-23 00:00", "2026-11-30 00:00", 7 * 24 * time.Hour},
		{"week on its Monday", Period{Unit: Week, Location: berlin}, "2026-11-30 00:00", "2026-11-30 00:00", "2026-12-07 00:00", 7 * 24 * time.Hour},
		{"month", Period{Unit: Month, Location: berlin}, "2026-11-30 23:59", "2026-11-01 00:00", "2026-12-01 00:00", 30 * 24 * time.Hour},
		{"month with DST", Period{Unit: Month, Location: berlin}, "2026-10-01 00:00", "2026-10-01 00:00", "2026-11-01 00:00", 31*24*time.Hour + time.Hour},
		{"anchor day 15", Period{Unit: Month, Location: berlin, AnchorDay: 15}, "2026-11-14 23:59", "2026-10-15 00:00", "2026-11-15 00:00", 31*24*time.Hour + time.Hour},
		{"anchor 31 in February", Period{Unit: Month, Location: berlin, AnchorDay: 31}, "2027-03-01 10:00", "2027-02-28 00:00", "2027-03-31 00:00", 31*24*time.Hour - time.Hour},
		{"anchor 31 in a leap February", Period{Unit: Month, AnchorDay: 31}, "2028-02-29 10:00", "2028-02-29 00:00", "2028-03-31 00:00", 31 * 24 * time.Hour},
		{"anchor 30 across the year", Period{Unit: Month, AnchorDay: 30}, "2027-01-10 00:00", "2026-12-30 00:00", "2027-01-30 00:00", 31 * 24 * time.Hour},
		{"year", Period{Unit: Year, Location: berlin}, "2026-12-31 23:59", "2026-01-01 00:00", "2027-01-01 00:00", 365 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.p.Validate(); err != nil {
				t.Fatal(err)
			}
			loc := tt.p.loc()
			in := func(s string) time.Time {
				v := at(s)
				return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), 0, 0, loc)
			}
			now := in(tt.t)
			if got, want := tt.p.Start(now), in(tt.start); !got.Equal(want) {
				t.Errorf("Start(%s) = %s, want %s", now, got, want)
			}
			if got, want := tt.p.Next(now), in(tt.next); !got.Equal(want) {
				t.Errorf("Next(%s) = %s, want %s", now, got, want)
			}
			if got := tt.p.Next(now).Sub(tt.p.Start(now)); got != tt.length {
				t.Errorf("period of %s lasts %s, want %s", now, got, tt.length)
			}
		})
	}
}

// TestPeriodsTile: over two years in zones with DST, odd offsets and none, every period ends
// where the next begins, holds the instants it is asked about, and begins at local midnight.
func TestPeriodsTile(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "America/Santiago"} {
		loc := mustLoad(t, zone)
		for _, p := range []Period{{Unit: Day, Location: loc}, {Unit: Week, Location: loc}, {Unit: Month, Location: loc},
			{Unit: Month, Location: loc, AnchorDay: 29}, {Unit: Year, Location: loc}} {
			t.Run(fmt.Sprintf("%s %s anchor %d", zone, p.Unit, p.AnchorDay), func(t *testing.T) {
				t.Parallel()
				for at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); at.Year() < 2028; at = at.Add(7 * time.Hour) {
					s, n := p.Start(at), p.Next(at)
					if at.Before(s) || !at.Before(n) {
						t.Fatalf("%s is outside its period [%s, %s)", at, s, n)
					}
					if p.Start(n) != n && !p.Start(n).Equal(n) {
						t.Fatalf("the period after %s begins at %s, not at %s", at, p.Start(n), n)
					}
					if l := s.In(loc); l.Hour() > 1 || l.Minute()%15 != 0 {
						t.Fatalf("period of %s begins at %s local, want midnight", at, l)
					}
				}
			})
		}
	}
}

func TestAround(t *testing.T) {
	t.Parallel()
	p := Period{Unit: Day}
	day := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		now   time.Time
		start time.Time
	}{
		{"first half: the day before and this one", day.Add(11 * time.Hour), day.AddDate(0, 0, -1)},
		{"second half: this day and the next", day.Add(13 * time.Hour), day},
		{"just before midnight", day.Add(24*time.Hour - time.Minute), day},
		{"just after midnight", day.Add(time.Minute), day.AddDate(0, 0, -1)},
	}
	for _, tt := range tests {
		s := p.Around(tt.now)
		if !s.Start.Equal(tt.start) || s.First != 24*time.Hour || s.Second != 24*time.Hour {
			t.Errorf("%s: Around(%s) = %+v, want two days from %s", tt.name, tt.now, s, tt.start)
		}
		if tt.now.Before(s.Start) || !tt.now.Before(s.End()) {
			t.Errorf("%s: Around(%s) = %+v does not hold it", tt.name, tt.now, s)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []Period{{}, {Unit: Week, AnchorDay: 15}, {Unit: Month, AnchorDay: 32}, {Unit: Month, AnchorDay: -1}} {
		if err := p.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", p)
		}
	}
	for _, w := range []string{"1d", "1w", "1mo", "1y"} {
		if u, ok := ParseUnit(w); !ok || u.String() != w {
			t.Errorf("ParseUnit(%q) = %v, %v", w, u, ok)
		}
	}
	if _, ok := ParseUnit("24h"); ok {
		t.Error("ParseUnit(24h) is a calendar unit, want not")
	}
}
