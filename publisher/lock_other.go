//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package publisher

import "os"

// lockFile does nothing where flock is not available: one client per spool folder is then
// up to the caller.
func lockFile(*os.File) error { return nil }
