package zookeepertest_test

import (
	"context"
	"testing"

	"github.com/quotaflow/quotaflow/internal/testbed/zookeepertest"
)

// TestStartStop: the server serves after Start, stops serving after Stop (as after a crash),
// and serves again on the same address after Start.
func TestStartStop(t *testing.T) {
	t.Parallel()
	zk, err := zookeepertest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer zk.Close()
	serving := zookeepertest.Serving(zk.Addr)
	if err := serving(context.Background()); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	zk.Stop()
	if err := serving(context.Background()); err == nil {
		t.Fatalf("%s still serves after Stop", zk.Addr)
	}
	if err := zk.Start(); err != nil {
		t.Fatal(err)
	}
	if err := serving(context.Background()); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}
