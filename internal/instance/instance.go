// Package instance names processes: the ids that checkers and aggregators put in decision ids,
// message ids and membership keys.
package instance

import (
	"crypto/rand"
	"encoding/hex"
)

// NewID returns 12 random hex characters: unique per process start for all practical purposes,
// and short enough to prefix every decision id.
func NewID() string {
	var b [6]byte
	rand.Read(b[:]) // never fails (crypto/rand panics where randomness is unavailable)
	return hex.EncodeToString(b[:])
}

// Named returns NewID, or name and a 6-character random suffix when name is set: a stable name
// (a pod name) stays readable while each process start stays unique, since ids repeated after a
// restart would be dropped by the stream as duplicates.
func Named(name string) string {
	id := NewID()
	if name == "" {
		return id
	}
	return name + "-" + id[:6]
}
