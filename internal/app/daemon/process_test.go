package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestServingFailureStopsProcess: a serving goroutine that fails (a lost port) stops the whole
// process: the others' context ends, Done closes, and Wait and Close return the failure once
// everything is released, last acquired first.
func TestServingFailureStopsProcess(t *testing.T) {
	t.Parallel()
	p := newProcess(nil)
	var released []string
	p.onClose(func() error { released = append(released, "first"); return nil })
	p.onClose(func() error { released = append(released, "second"); return errors.New("second: flush failed") })
	fail := make(chan struct{})
	lost := errors.New("port lost")
	p.goServe(func(ctx context.Context) error {
		<-fail
		return lost
	})
	othersStopped := make(chan struct{})
	p.goServe(func(ctx context.Context) error {
		<-ctx.Done()
		close(othersStopped)
		return nil
	})
	p.started()
	select {
	case <-p.Done():
		t.Fatal("Done closed before any goroutine stopped")
	case <-time.After(20 * time.Millisecond):
	}
	close(fail)
	<-othersStopped
	<-p.Done()
	err := p.Wait()
	if !errors.Is(err, lost) || err == nil || !strings.Contains(err.Error(), "second: flush failed") {
		t.Errorf("Wait = %v, want the serving failure joined with the release's error", err)
	}
	if got := p.Close(); got != err {
		t.Errorf("Close after Wait = %v, want the same %v", got, err)
	}
	if want := []string{"second", "first"}; len(released) != 2 || released[0] != want[0] || released[1] != want[1] {
		t.Errorf("released %v, want %v (last acquired first, once)", released, want)
	}
}
