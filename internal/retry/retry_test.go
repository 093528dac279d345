package retry

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep(1ms) = false, want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep on a cancelled context = true, want false")
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		b    Backoff
		want []time.Duration
	}{
		{"zero", Backoff{}, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}},
		{"capped", Backoff{Max: 300 * time.Millisecond}, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}},
		{"min", Backoff{Min: 250 * time.Millisecond, Max: time.Second}, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, want := range tt.want {
				if got := tt.b.Next(); got != want {
					t.Errorf("wait %d = %v, want %v", i, got, want)
				}
			}
			tt.b.Reset()
			if got := tt.b.Next(); got != tt.want[0] {
				t.Errorf("after Reset: %v, want %v", got, tt.want[0])
			}
		})
	}
}
