package checker

import (
	"context"
	"testing"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/checkertest"
)

// serverError is a Redis error reply, as go-redis returns them.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	rdb := checkertest.Redis(redisSrv.Addr)
	defer rdb.Close()
	scriptErr := rdb.Eval(context.Background(), "return redis.error_reply('ERR bucket: malformed arguments')", nil).Err()
	down := checkertest.Redis("127.0.0.1:1") // nothing listens there
	defer down.Close()
	refused := down.Ping(context.Background()).Err()
	_, invalid := bucket.NewStore(rdb).Check(context.Background(), []bucket.Request{{Cost: 1}})
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
	}
	for _, tt := range tests {
		if tt.err == nil {
			t.Fatalf("%s: no error to classify", tt.name)
		}
		if got := unavailable(tt.err); got != tt.want {
			t.Errorf("unavailable(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
