package loadgen

import (
	"context"
	"testing"
	"time"
)

// TestPace: every slot from start to end is sent once, in order, never before it is due, and
// the channel is closed after the last.
func TestPace(t *testing.T) {
	t.Parallel()
	start := time.Now()
	interval := float64(time.Millisecond)
	end := start.Add(40 * time.Millisecond)
	out := make(chan time.Time) // unbuffered: a slot is received when it is sent
	go pace(context.Background(), start, end, interval, out)
	var k int64
	for at := range out {
		now := time.Now()
		if want := slotTime(start, k, interval); !at.Equal(want) {
			t.Fatalf("slot %d: due %v, want %v", k, at.Sub(start), want.Sub(start))
		}
		if now.Before(at) {
			t.Errorf("slot %d sent %v before it was due", k, at.Sub(now))
		}
		k++
	}
	if want := slotsBefore(start, end, interval); k != want {
		t.Errorf("got %d slots, want %d", k, want)
	}
}

// TestPaceStops: cancelling ctx ends pace in the middle of a long wait and closes the channel.
func TestPaceStops(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	out := make(chan time.Time, 1)
	go pace(ctx, start, start.Add(time.Hour), float64(10*time.Minute), out)
	if at := <-out; !at.Equal(start) {
		t.Fatalf("first slot due %v, want at start", at.Sub(start))
	}
	cancel()
	select {
	case at, ok := <-out:
		if ok {
			t.Fatalf("slot due at %v sent after cancel", at.Sub(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pace still running 10s after cancel")
	}
}
