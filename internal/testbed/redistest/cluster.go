package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Ports of cluster nodes. Each node also listens on its cluster bus, port+busOffset, so a
// node's port must leave room for its bus below 65536.
const (
	busOffset      = 10000
	maxClusterPort = 65535 - busOffset
	// portTries bounds the search for ports: the system hands out ports above maxClusterPort
	// too, which the search skips.
	portTries = 500
)

// Cluster is a Redis Cluster of redis-server processes owned by a test: masters that share the
// 16384 slots, each with its replicas, all on loopback with nothing kept on disk.
//
// Its nodes fail over within a few seconds (cluster-node-timeout 1000 ms). A replica never
// moves to another master by itself (cluster-allow-replica-migration no), so that the shape of
// the cluster changes only as a test makes it.
type Cluster struct {
	// Addrs are host:port of every node, masters and replicas.
	Addrs []string

	nodes    []*Node
	seeds    []string
	replicas int // replicas per master, as asked for
}

// StartCluster starts masters+masters*replicasPerMaster cluster-enabled redis-server
// processes, makes a cluster of them with `redis-cli --cluster create` and waits until every
// node says the cluster is ok and every replica follows its master. Redis wants at least three
// masters.
func StartCluster(masters, replicasPerMaster int) (*Cluster, error) {
	if masters < 3 || replicasPerMaster < 0 {
		return nil, fmt.Errorf("cluster of %d masters with %d replicas each: want 3 or more masters", masters, replicasPerMaster)
	}
	n := masters * (1 + replicasPerMaster)
	ports, err := clusterPorts(n)
	if err != nil {
		return nil, err
	}
	cfgs := make([]nodeConfig, n)
	for i, port := range ports {
		cfgs[i] = nodeConfig{name: "redis-cluster", port: port, args: func(dir string) []string {
			return append(serverArgs(dir, port),
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "1000",
				// A replica that lost its master long ago still takes over: tests kill and
				// restart nodes at will and want the failover, not a stale-data guard.
				"--cluster-replica-validity-factor", "0",
				"--cluster-allow-replica-migration", "no",
			)
		}}
	}
	nodes, err := startNodes(cfgs)
	if err != nil {
		return nil, fmt.Errorf("start cluster nodes: %w", err)
	}
	c := &Cluster{nodes: nodes, replicas: replicasPerMaster}
	for _, node := range nodes {
		c.Addrs = append(c.Addrs, node.Addr)
	}
	if err := c.create(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// create makes a cluster of the started nodes and waits until it is whole.
func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	args := append(append([]string{"--cluster", "create"}, c.Addrs...),
		"--cluster-replicas", strconv.Itoa(c.replicas), "--cluster-yes")
	if err := redisCLI(ctx, args...); err != nil {
		return fmt.Errorf("create cluster: %w%s", err, logTails(c.nodes))
	}
	if err := poll.Wait(ctx, "cluster to form", func(ctx context.Context) error { return c.health(ctx, true) }); err != nil {
		return fmt.Errorf("%w%s", err, logTails(c.nodes))
	}
	masters, err := c.Masters(ctx)
	if err != nil {
		return err
	}
	for _, m := range masters {
		c.seeds = append(c.seeds, m.Addr)
	}
	return nil
}

// MainCluster is a TestMain helper: it starts a cluster of three masters with one replica
// each, runs the tests and closes the cluster. It sets *c before the tests run.
//
// Tests that share it should not change its shape; a test that kills nodes or reshards starts
// a cluster of its own.
func MainCluster(m interface{ Run() int }, c **Cluster) int {
	return proctest.Main("redistest", m, c, func() (*Cluster, error) { return StartCluster(3, 1) })
}

// Seeds are host:port of the nodes that were masters when the cluster was made: what a
// client is given to find the rest. A client needs only one of them to answer.
func (c *Cluster) Seeds() []string {
	return append([]string(nil), c.seeds...)
}

// Client returns a cluster client seeded with Seeds and configured as the checker configures
// its clients (context deadlines enforced); the caller closes it.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), ContextTimeoutEnabled: true})
}

// Nodes returns every node, in the order of Addrs.
func (c *Cluster) Nodes() []*Node {
	return append([]*Node(nil), c.nodes...)
}

// Close stops every node and removes their folders.
func (c *Cluster) Close() {
	closeNodes(c.nodes)
}

// node is the node at addr, or nil.
func (c *Cluster) node(addr string) *Node {
	for _, n := range c.nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// clusterPorts finds n loopback ports that are free, at most maxClusterPort, and whose bus
// ports are free too. It holds every port it tried until it is done, so that the system does
// not offer a rejected port again; another process may still take a port before its node binds
// it, which on a test machine is rare enough.
func clusterPorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range portTries {
		if len(ports) == n {
			return ports, nil
		}
		l, err := net.Listen("tcp", proctest.Addr(0))
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if port > maxClusterPort {
			continue
		}
		bus, err := net.Listen("tcp", proctest.Addr(port+busOffset))
		if err != nil {
			continue // Taken: try another port.
		}
		held = append(held, bus)
		ports = append(ports, port)
	}
	if len(ports) == n {
		return ports, nil
	}
	return nil, fmt.Errorf("found %d of %d free port pairs (port, port+%d) at most %d in %d tries",
		len(ports), n, busOffset, maxClusterPort, portTries)
}

// redisCLI runs redis-cli with args. Its error carries what redis-cli printed, which says
// why a cluster command failed.
func redisCLI(ctx context.Context, args ...string) error {
	path, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("redis-cli not found (run `make test`, which installs it): %w", err)
	}
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		s := strings.TrimSpace(string(out))
		s = s[max(0, len(s)-logTailSize):]
		return fmt.Errorf("redis-cli %s: %w; output:\n%s", strings.Join(args[:2], " "), err, s)
	}
	return nil
}
