// Package progress shows how far a long command got (bench, migrate, backtest) on one line of
// a terminal, rewritten in place. When the output is not a terminal — a pipe, a file, a CI
// log — it shows nothing: a script reading the command's output, or a log kept of it, gets
// the result only, not a line per tick nor carriage returns.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// minInterval is the shortest time between two redraws: a replay calls Printf per batch, far
// more often than anyone reads.
const minInterval = 100 * time.Millisecond

// Line is one line of progress on a terminal. Its methods are safe for concurrent use, and do
// nothing when the writer is not a terminal.
type Line struct {
	w  io.Writer
	on bool

	mu    sync.Mutex
	last  time.Time
	shown bool
}

// New returns the progress line of w: shown when w is a terminal (an *os.File whose
// descriptor is one), else silent.
func New(w io.Writer) *Line {
	f, ok := w.(*os.File)
	return &Line{w: w, on: ok && term.IsTerminal(int(f.Fd()))}
}

// On reports whether the line is shown: whether its writer is a terminal.
func (l *Line) On() bool { return l.on }

// Printf rewrites the line, at most every 100ms: the first call is always shown, a later one
// within 100ms of the last shown is dropped.
func (l *Line) Printf(format string, args ...any) {
	if !l.on {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); l.shown && now.Sub(l.last) < minInterval {
		return
	} else {
		l.last = now
	}
	l.shown = true
	fmt.Fprintf(l.w, "\r%s\x1b[K", fmt.Sprintf(format, args...))
}

// Write shows p, a line of progress written by code that prints lines (loadgen's), in place
// of the last; it always reports all of p written, so that progress never fails a command.
func (l *Line) Write(p []byte) (int, error) {
	if line := strings.TrimRight(string(p), "\r\n"); line != "" {
		l.Printf("%s", line)
	}
	return len(p), nil
}

// Clear erases the line, so that what the command prints next starts on a clean line.
func (l *Line) Clear() {
	if !l.on {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shown {
		io.WriteString(l.w, "\r\x1b[K")
		l.shown = false
	}
}
