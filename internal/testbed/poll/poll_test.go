package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestWait: a condition that comes to hold ends the wait without an error; one that never does
// ends it with ctx, and the error names what was awaited and wraps both ctx's error and the
// condition's last.
func TestWait(t *testing.T) {
	t.Parallel()
	errNotYet := errors.New("not yet")
	tests := []struct {
		name    string
		holdsAt int // the look at which the condition holds; 0: never
		wantErr bool
	}{
		{"at once", 1, false},
		{"after a few looks", 5, false},
		{"never", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			looks := 0
			err := Wait(ctx, "the thing", func(context.Context) error {
				looks++
				if looks == tt.holdsAt {
					return nil
				}
				return fmt.Errorf("look %d: %w", looks, errNotYet)
			})
			if got := err != nil; got != tt.wantErr {
				t.Fatalf("Wait = %v, want an error: %t", err, tt.wantErr)
			}
			if !tt.wantErr {
				if looks != tt.holdsAt {
					t.Errorf("%d looks, want %d", looks, tt.holdsAt)
				}
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errNotYet) || !strings.Contains(err.Error(), "the thing") {
				t.Errorf("Wait = %v, want it to name the thing and wrap the deadline and the last error", err)
			}
		})
	}
}

// fatalRecorder records Until's failure instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) { r.msg = fmt.Sprintf(format, args...) }

// TestUntil: Until returns once the condition holds, and otherwise fails after its timeout with
// what it awaited and the condition's last error; True's condition says it is still false.
func TestUntil(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cond func() error
		want string // in the failure; "": none
	}{
		{"holds", func() error { return nil }, ""},
		{"fails", func() error { return errors.New("3 of 4 rows") }, "not within 50ms: wait for the rows: context deadline exceeded (last: 3 of 4 rows)"},
		{"true", True(func() bool { return true }), ""},
		{"false", True(func() bool { return false }), "(last: still false)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &fatalRecorder{TB: t}
			Until(r, 50*time.Millisecond, "the rows", tt.cond)
			if got := r.msg; (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("failure %q, want %q", got, tt.want)
			}
		})
	}
}
