package schema

import "time"

// SetLockStale sets how old a migration lock is taken for a crashed holder's, and returns the
// previous value.
func SetLockStale(d time.Duration) time.Duration {
	old := lockStale
	lockStale = d
	return old
}
