//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package publisher

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on f, released when f is closed or the process exits.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
