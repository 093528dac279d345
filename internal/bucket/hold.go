package bucket

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// holdSource is the script of Release and Renew; see hold.lua for its contract. Like
// allot.lua, it lives beside this file, not under lua/, whose files are parts of the check
// script.
//
//go:embed hold.lua
var holdSource string

var holdScript = redis.NewScript(holdSource)

// The outcomes of Release and Renew that are no error of the store: the holder's place is not
// held (ErrNotHeld: never taken, already released, or expired and pruned), or it freed itself
// at its expiry (ErrExpired; it is removed now). Neither changes anything else.
var (
	ErrNotHeld = errors.New("bucket: not held (unknown holder, or already released)")
	ErrExpired = errors.New("bucket: expired (the place freed itself)")
)

// Release frees the place holder holds in the concurrency bucket key (a charge of a limit
// whose Holder it was), so that another check can take it before its expiry. It returns when
// it would have expired. Releasing twice is ErrNotHeld the second time, never a second free;
// an expired place is ErrExpired. Any other error means the outcome is unknown: the place is
// then released, or frees itself at its expiry.
func (s *Store) Release(ctx context.Context, key, holder string) (time.Time, error) {
	return s.hold(ctx, key, "release", holder, 0)
}

// Renew extends the place holder holds in key to ttl from Redis's now, and returns the new
// expiry. ErrNotHeld and ErrExpired as Release: an expired place cannot be renewed, since
// another check may have taken it.
func (s *Store) Renew(ctx context.Context, key, holder string, ttl time.Duration) (time.Time, error) {
	if ttl < time.Microsecond || ttl.Microseconds() > maxValue {
		return time.Time{}, fmt.Errorf("bucket: renew %q: %w: TTL must be between 1µs and %v, got %v",
			key, ErrInvalidRequest, time.Duration(maxValue)*time.Microsecond, ttl)
	}
	return s.hold(ctx, key, "renew", holder, ttl)
}

func (s *Store) hold(ctx context.Context, key, op, holder string, ttl time.Duration) (time.Time, error) {
	if key == "" || holder == "" || len(holder) > MaxHolder {
		return time.Time{}, fmt.Errorf("bucket: %s %q: %w: a key and a holder of 1 to %d bytes", op, key, ErrInvalidRequest, MaxHolder)
	}
	args := []any{op, holder, strconv.FormatInt(ttl.Microseconds(), 10), strconv.FormatInt(s.b.cfg.ClockOffset.Microseconds(), 10)}
	// Not retried by go-redis (scriptCmd): a renew sent twice is harmless, a release too (the
	// second is ErrNotHeld), but a caller must learn that the first one's outcome is unknown.
	cmd := newScriptCmd(ctx, append([]any{"evalsha", holdScript.Hash(), 1, key}, args...), 1)
	_ = s.rdb.Process(ctx, scriptCmd{cmd})
	if isNoScript(cmd.Err()) {
		cmd = newScriptCmd(ctx, append([]any{"eval", holdSource, 1, key}, args...), 1)
		_ = s.rdb.Process(ctx, scriptCmd{cmd})
	}
	arr, err := cmd.Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("bucket: %s %q: %w", op, key, err)
	}
	if len(arr) != 2 {
		return time.Time{}, fmt.Errorf("bucket: %s %q: %w", op, key, ErrMalformedReply)
	}
	us, perr := strconv.ParseInt(arr[1], 10, 64)
	if perr != nil {
		return time.Time{}, fmt.Errorf("bucket: %s %q: %w", op, key, ErrMalformedReply)
	}
	at := time.UnixMicro(us)
	switch arr[0] {
	case "held":
		return at, nil
	case "expired":
		return at, ErrExpired
	case "unknown":
		return time.Time{}, ErrNotHeld
	}
	return time.Time{}, fmt.Errorf("bucket: %s %q: %w", op, key, ErrMalformedReply)
}
