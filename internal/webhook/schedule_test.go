package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/webhook"
)

// TestScheduleNext: the waits after each failed attempt, and the attempt after which the
// message is given up.
func TestScheduleNext(t *testing.T) {
	t.Parallel()
	h := time.Hour
	noEvery := webhook.Schedule{Delays: []time.Duration{time.Second, 2 * time.Second}, Span: h}
	tight := webhook.Schedule{Delays: []time.Duration{time.Second, h}, Every: h, Span: 30 * time.Minute}
	tests := []struct {
		name     string
		s        webhook.Schedule
		n        int
		wantWait time.Duration
		wantOK   bool
	}{
		{"default, after the first", webhook.DefaultSchedule, 1, 5 * time.Second, true},
		{"default, after the second", webhook.DefaultSchedule, 2, 30 * time.Second, true},
		{"default, after the seventh", webhook.DefaultSchedule, 7, 2 * h, true},
		{"default, after the eighth", webhook.DefaultSchedule, 8, 4 * h, true},
		{"default, after the twelfth: the thirteenth at 23h42m35s", webhook.DefaultSchedule, 12, 4 * h, true},
		{"default, after the thirteenth: past the day", webhook.DefaultSchedule, 13, 0, false},
		{"default, a huge count", webhook.DefaultSchedule, 1 << 30, 0, false},
		{"attempt 0 counts as the first", webhook.DefaultSchedule, 0, 5 * time.Second, true},
		{"no Every: the delays only", noEvery, 2, 2 * time.Second, true},
		{"no Every: then no more", noEvery, 3, 0, false},
		{"a delay past the span", tight, 2, 0, false},
		{"a delay within the span", tight, 1, time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if wait, ok := tt.s.Next(tt.n); wait != tt.wantWait || ok != tt.wantOK {
				t.Errorf("Next(%d) = %v, %v; want %v, %v", tt.n, wait, ok, tt.wantWait, tt.wantOK)
			}
		})
	}
}

// TestDefaultScheduleSpansADay: the default schedule's attempts end within 24 hours of the
// first, the next one past them.
func TestDefaultScheduleSpansADay(t *testing.T) {
	t.Parallel()
	var offset time.Duration
	n := 1
	for ; ; n++ {
		wait, ok := webhook.DefaultSchedule.Next(n)
		if !ok {
			break
		}
		offset += wait
	}
	if n != 13 || offset > 24*time.Hour || offset+4*time.Hour <= 24*time.Hour {
		t.Errorf("default schedule: %d attempts, the last at %v; want 13, the last within a day and the next past it", n, offset)
	}
}

// TestNewRefusesConfig: a config without a stream, or with a schedule that cannot retry, is
// refused naming the field.
func TestNewRefusesConfig(t *testing.T) {
	t.Parallel()
	js := natsSrv.JetStream(t)
	tests := []struct {
		name      string
		cfg       webhook.Config
		wantField string
	}{
		{"no stream", webhook.Config{}, "stream"},
		{"negative timeout", webhook.Config{Stream: "S", Timeout: -time.Second}, "timeout"},
		{"schedule without span", webhook.Config{Stream: "S", Schedule: webhook.Schedule{Delays: []time.Duration{time.Second}}}, "schedule"},
		{"schedule with a negative delay", webhook.Config{Stream: "S", Schedule: webhook.Schedule{Delays: []time.Duration{-1}, Span: time.Hour}}, "schedule"},
		{"zero value but the stream", webhook.Config{Stream: "S"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d, err := webhook.New(js, tt.cfg)
			if got := fieldOf(err); got != tt.wantField || (tt.wantField == "") != (err == nil) {
				t.Errorf("New = %v (field %q), want field %q", err, got, tt.wantField)
			}
			if d != nil {
				d.Close()
			}
		})
	}
}

// TestMemoryLog: the newest entries, by endpoint, oldest first.
func TestMemoryLog(t *testing.T) {
	t.Parallel()
	log := webhook.NewMemoryLog(3)
	for i := range 5 {
		log.Record(context.Background(), fmt.Sprint("e", i%2), fmt.Sprint("m", i), webhook.Attempt{N: i})
	}
	var got []string
	for _, e := range log.Entries("") {
		got = append(got, e.Endpoint+"/"+e.Message)
	}
	if want := "[e0/m2 e1/m3 e0/m4]"; fmt.Sprint(got) != want {
		t.Errorf("entries %v, want %v", got, want)
	}
	if got := log.Entries("e1"); len(got) != 1 || got[0].Message != "m3" {
		t.Errorf("entries of e1 %+v, want m3 only", got)
	}
}
