package bucket

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrMalformedReply is wrapped by Check's error when a script reply does not have the shape
// lua/call.lua promises. Redis answered: it is a bug of this process or of the script, to be
// reported for the check it concerns, never taken for an outage (Unavailable reports false).
var ErrMalformedReply = errors.New("malformed script reply")

// unavailablePrefixes are the Redis error replies of a server that cannot run a script now:
// loading its data, busy with a slow script, a read-only replica, a master without its replicas
// or its cluster, a slot in migration, out of memory. Any other error reply is the script's.
var unavailablePrefixes = [...]string{"LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "OOM", "NOREPLICAS"}

// Unavailable reports whether err means that Redis cannot answer now — the network, a deadline,
// a closed pool, or one of the server states above — as opposed to an error of the request or
// the script (ErrInvalidRequest, ErrMalformedReply, ErrIdempotencyConflict, a script's error
// reply), which is a bug or a refusal to report, not a reason to stop calling Redis.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrMalformedReply) || errors.Is(err, ErrIdempotencyConflict) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network, timeout, closed pool
	}
	for _, prefix := range unavailablePrefixes {
		if strings.HasPrefix(rerr.Error(), prefix) {
			return true
		}
	}
	return false
}
