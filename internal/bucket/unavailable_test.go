package bucket

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// serverError is a Redis error reply, as go-redis returns them.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

// TestUnavailable: what Redis cannot answer now is told apart from what it answered wrongly or
// refused (a script error, a malformed reply, an invalid request), which must never be taken
// for an outage.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	rdb := client(t)
	scriptErr := rdb.Eval(context.Background(), "return redis.error_reply('ERR bucket: malformed arguments')", []string{key(t, "e")}).Err()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}) // nothing listens there
	defer down.Close()
	refused := down.Ping(context.Background()).Err()
	store := NewStore(rdb)
	defer store.Close()
	_, invalid := store.Check(context.Background(), []Request{{Cost: 1}})
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"deadline", context.DeadlineExceeded, true},
		{"loading", serverError("LOADING Redis is loading the dataset in memory"), true},
		{"read-only replica", serverError("READONLY You can't write against a read only replica."), true},
		{"out of memory", serverError("OOM command not allowed when used memory > 'maxmemory'."), true},
		{"script error", scriptErr, false},
		{"invalid request", invalid, false},
		{"malformed reply", fmt.Errorf("bucket: request 0: %w", ErrMalformedReply), false},
		// A store wrapping this one (the engine tests' Config.store) reports a conflict in an error of its own.
		{"idempotency conflict", fmt.Errorf("records: request 0: %w", ErrIdempotencyConflict), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if tt.err == nil && tt.name != "nil" {
			t.Fatalf("%s: no error to classify", tt.name)
		}
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("Unavailable(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
