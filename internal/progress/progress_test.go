package progress_test

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/quotaflow/quotaflow/internal/progress"
)

// TestTerminal: on a real pseudo-terminal the line is drawn in place, throttled, and cleared.
func TestTerminal(t *testing.T) {
	t.Parallel()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	l := progress.New(tty)
	if !l.On() {
		t.Fatal("a pseudo-terminal's progress line is off, want on")
	}
	l.Printf("step %d/%d", 1, 3)
	l.Printf("step %d/%d", 2, 3) // within 100ms of the first: dropped
	l.Clear()
	tty.Close() // the reader below ends at the terminal's close
	got, _ := io.ReadAll(ptmx)
	if want := "\rstep 1/3\x1b[K\r\x1b[K"; !strings.HasPrefix(string(got), want) || strings.Contains(string(got), "2/3") {
		t.Errorf("terminal got %q, want %q and nothing of the dropped step", got, want)
	}
}

// TestNotTerminal: a buffer, a pipe or a file gets nothing.
func TestNotTerminal(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var buf bytes.Buffer
	for name, out := range map[string]io.Writer{"buffer": &buf, "pipe": w} {
		l := progress.New(out)
		if l.On() {
			t.Errorf("%s: progress on, want off", name)
		}
		l.Printf("step 1")
		l.Write([]byte("bench 1s\n"))
		l.Clear()
	}
	w.Close()
	piped, _ := io.ReadAll(r)
	if buf.Len() != 0 || len(piped) != 0 {
		t.Errorf("buffer got %q, pipe got %q; want nothing", buf.String(), piped)
	}
}
