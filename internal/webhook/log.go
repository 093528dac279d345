package webhook

import (
	"context"
	"sync"
)

// Log is the delivery log: every attempt of every message to every endpoint, for the
// endpoints' owners to see what was sent, what their receiver answered and what is still
// to be retried. Record is called once per attempt, before the message is acknowledged, with
// a bounded context; an error is logged and does not hold the delivery up (retrying the
// delivery for the log's sake would send the receiver copies). It must be safe for
// concurrent use: the endpoints' loops call it at once.
type Log interface {
	Record(ctx context.Context, endpointID, msgID string, a Attempt) error
}

// Entry is one attempt of the delivery log.
type Entry struct {
	Endpoint string
	Message  string
	Attempt
}

// DefaultMemoryEntries is how many entries a MemoryLog made with 0 keeps.
const DefaultMemoryEntries = 10000

// MemoryLog is a Log in memory, keeping the newest entries: for tests, and for a single
// process that needs no history across restarts.
type MemoryLog struct {
	mu      sync.Mutex
	max     int
	entries []Entry
}

// NewMemoryLog returns a MemoryLog that keeps the max newest entries (DefaultMemoryEntries
// when max <= 0).
func NewMemoryLog(max int) *MemoryLog {
	if max <= 0 {
		max = DefaultMemoryEntries
	}
	return &MemoryLog{max: max}
}

// Record appends an entry, dropping the oldest beyond the log's size. It never fails.
func (l *MemoryLog) Record(_ context.Context, endpointID, msgID string, a Attempt) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, Entry{Endpoint: endpointID, Message: msgID, Attempt: a})
	if len(l.entries) > l.max {
		l.entries = l.entries[len(l.entries)-l.max:]
	}
	return nil
}

// Entries returns the entries of the endpoint (all when ""), oldest first.
func (l *MemoryLog) Entries(endpointID string) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Entry
	for _, e := range l.entries {
		if endpointID == "" || e.Endpoint == endpointID {
			out = append(out, e)
		}
	}
	return out
}
