package bucket

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// TestNotSent: only an error that proves a script call never reached Redis may have the call
// sent again; each case is the error go-redis really returns. A timeout or a connection closed
// after the call was written may come after the script ran, and must never be taken for one.
func TestNotSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Nothing listens on port 1: the dial is refused.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	defer down.Close()
	refused := down.Ping(ctx).Err()

	closedClient := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	closedClient.Close()
	closed := closedClient.Ping(ctx).Err()

	// A server that takes the connection and never answers: the call was written, the reply
	// times out.
	silent := listen(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1<<16)); <-make(chan struct{}) })
	mute := redis.NewClient(&redis.Options{Addr: silent, MaxRetries: -1, Protocol: 2, DisableIdentity: true, ReadTimeout: 100 * time.Millisecond})
	defer mute.Close()
	timedOut := mute.Ping(ctx).Err()

	// A server that reads the call and closes the connection: it may have run.
	dropping := listen(t, func(c net.Conn) { _, _ = c.Read(make([]byte, 1<<16)); c.Close() })
	drop := redis.NewClient(&redis.Options{Addr: dropping, MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	defer drop.Close()
	dropped := drop.Ping(ctx).Err()

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"client closed", closed, true},
		{"reply timed out", timedOut, false},
		{"connection closed after the write", dropped, false},
		{"deadline", context.DeadlineExceeded, false},
		{"moved", serverError("MOVED 3999 127.0.0.1:6381"), false},
		{"cluster down", serverError("CLUSTERDOWN The cluster is down"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil && tt.name != "nil" {
				t.Fatal("no error to classify")
			}
			if got := notSent(tt.err); got != tt.want {
				t.Errorf("notSent(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// listen serves each connection to a local port with serve until the test ends, and returns
// the port's address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().String()
}

// TestRefusedWithoutFailover: a call refused by a dead master whose slot no other master has
// taken over (no replica to promote) keeps its error and is answered at once, not held until
// the batch's deadline in the hope of a new slot map: the caller decides it by its fail mode
// while the cluster is incomplete.
func TestRefusedWithoutFailover(t *testing.T) {
	t.Parallel()
	cl, err := redistest.StartCluster(3, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	rdb, err := NewRedisClient(RedisConfig{Cluster: cl.Seeds()})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	// A deadline no test waits out: a call held until it would end the test by its timeout.
	s := NewStoreWithConfig(rdb, StoreConfig{BatchTimeout: time.Hour})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := one(lim(key(t, "refused"), algorithm.FixedWindow, 10, time.Hour, 0), 1)
	if _, err := s.Check(ctx, []Request{req}); err != nil {
		t.Fatal(err)
	}
	m, err := cl.MasterOf(ctx, req.Limits[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	m.Kill()
	_, err = s.Check(ctx, []Request{req})
	if !notSent(err) || !Unavailable(err) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("check on the dead master = %v, want its refused connection", err)
	}
}
