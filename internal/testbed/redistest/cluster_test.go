package redistest_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// startCluster starts a cluster of three masters with a replica each for the test alone.
func startCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	start := time.Now()
	c, err := redistest.StartCluster(3, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	t.Logf("cluster of %d nodes started in %v", len(c.Addrs), time.Since(start).Round(time.Millisecond))
	return c
}

func clusterClient(t *testing.T, c *redistest.Cluster) *redis.ClusterClient {
	t.Helper()
	rdb := c.Client()
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestClusterSpreadsHashTags(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if len(c.Addrs) != 6 || len(c.Seeds()) != 3 {
		t.Fatalf("%d nodes, %d seeds: want 6 and 3", len(c.Addrs), len(c.Seeds()))
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	rdb := clusterClient(t, c)
	if info := rdb.ClusterInfo(ctx).Val(); !containsLine(info, "cluster_state:ok") {
		t.Fatalf("cluster info:\n%s", info)
	}

	// Keys of different hash tags: one for each master, found by asking the cluster.
	owner := map[string]string{} // master addr -> key
	for i := 0; len(owner) < len(masters) && i < 100; i++ {
		key := fmt.Sprintf("{tag%d}:bucket", i)
		m, err := c.MasterOf(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := owner[m.Addr]; !ok {
			owner[m.Addr] = key
		}
	}
	if len(owner) != len(masters) {
		t.Fatalf("100 hash tags landed on %d masters, want %d", len(owner), len(masters))
	}
	for addr, key := range owner {
		if err := rdb.Set(ctx, key, addr, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
	}
	// Each master holds one key, the one whose tag MasterOf gave it.
	for _, m := range masters {
		n := m.Client()
		size, err := n.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		exists, err := n.Exists(ctx, owner[m.Addr]).Result()
		n.Close()
		if err != nil || size != 1 || exists != 1 {
			t.Errorf("master %s: %d keys, %s exists %d, %v; want it alone", m.Addr, size, owner[m.Addr], exists, err)
		}
	}
}

func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	rdb := clusterClient(t, c)
	const key = "{failover}:bucket"
	old, err := c.MasterOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Write on the master and wait for its replica to have it, so that the failover keeps it.
	writeReplicated(ctx, t, old, key, "kept")

	start := time.Now()
	old.Kill()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("replica took over in %v", time.Since(start).Round(time.Millisecond))
	promoted, err := c.MasterOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if promoted == old {
		t.Fatalf("%s still serves %s after it was killed", old.Addr, key)
	}
	// A client may see errors for a moment after a failover, until it finds the new master.
	var got string
	err = poll.Wait(ctx, "the write through the cluster client", func(ctx context.Context) error {
		var err error
		got, err = rdb.Get(ctx, key).Result()
		return err
	})
	if err != nil || got != "kept" {
		t.Errorf("get %s through the cluster client after the failover: %q, %v", key, got, err)
	}

	start = time.Now()
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("old master rejoined in %v", time.Since(start).Round(time.Millisecond))
	n := old.Client()
	defer n.Close()
	role, err := n.Do(ctx, "role").Slice()
	if err != nil || len(role) < 2 || role[0] != "slave" {
		t.Fatalf("restarted %s: role %v, %v; want a replica", old.Addr, role, err)
	}
	conn := n.Conn() // READONLY holds for one connection.
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := conn.Get(ctx, key).Result(); err != nil || got != "kept" {
		t.Errorf("restarted %s has %s = %q, %v; want it synced from the new master", old.Addr, key, got, err)
	}
}

func TestClusterReshard(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	rdb := clusterClient(t, c)
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	from, to := masters[0], masters[1]
	// Keys all over the slots, which must survive the move.
	for i := range 200 {
		if err := rdb.Set(ctx, fmt.Sprintf("key%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before := slotCounts(ctx, t, rdb)

	start := time.Now()
	if err := c.Reshard(ctx, from.Addr, to.Addr, 100); err != nil {
		t.Fatal(err)
	}
	t.Logf("resharded 100 slots in %v", time.Since(start).Round(time.Millisecond))
	after := slotCounts(ctx, t, rdb)
	if after[from.Addr] != before[from.Addr]-100 || after[to.Addr] != before[to.Addr]+100 {
		t.Errorf("slots of %s, %s: %d, %d before, %d, %d after; want 100 moved", from.Addr, to.Addr,
			before[from.Addr], before[to.Addr], after[from.Addr], after[to.Addr])
	}
	for i := range 200 {
		key := fmt.Sprintf("key%d", i)
		if got, err := rdb.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("get %s after the reshard: %d, %v", key, got, err)
		}
	}
}

// slotCounts is how many slots each master serves, as the cluster tells its client.
func slotCounts(ctx context.Context, t *testing.T, rdb *redis.ClusterClient) map[string]int {
	t.Helper()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role != "master" {
				continue
			}
			for _, r := range sh.Slots {
				counts[net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))] += int(r.End - r.Start + 1)
			}
		}
	}
	return counts
}
