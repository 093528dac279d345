package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// sentinelCount is the number of sentinels of a group: the fewest that can elect a leader
// with one of them down.
const sentinelCount = 3

// Sentinel is a Redis Sentinel group owned by a test: a master and its replica, watched by
// three sentinels that fail over to the replica about a second after the master stops
// answering (down-after-milliseconds 1000, failover-timeout 5000).
type Sentinel struct {
	// MasterName is the name the sentinels know the master by.
	MasterName string
	// SentinelAddrs are host:port of the sentinels.
	SentinelAddrs []string

	nodes     []*Node // the master and the replica, as started
	sentinels []*Node
	ask       []*redis.SentinelClient // one for each sentinel, which does not retry
}

// StartSentinel starts a master, a replica of it and three sentinels (`redis-server
// --sentinel`) that watch the master with the given quorum, and waits until every sentinel
// knows the master, the replica and the other sentinels.
func StartSentinel(quorum int) (*Sentinel, error) {
	if quorum < 1 || quorum > sentinelCount {
		return nil, fmt.Errorf("sentinel quorum %d: want 1 to %d", quorum, sentinelCount)
	}
	ports, err := proctest.FreePorts(2 + sentinelCount)
	if err != nil {
		return nil, err
	}
	s := &Sentinel{MasterName: "quotaflow"}
	if err := s.start(ports, quorum); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// start starts the group's processes, each kind once the ones it follows serve, and waits
// until the group is whole. A replica tries its master once a second and a sentinel asks a
// master for its replicas every ten, so starting them in order saves seconds.
func (s *Sentinel) start(ports []int, quorum int) error {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	master, err := startNode(nodeConfig{name: "redis-master", port: ports[0], args: func(dir string) []string {
		return serverArgs(dir, ports[0])
	}})
	if err != nil {
		return err
	}
	s.nodes = append(s.nodes, master)
	replica, err := startNode(nodeConfig{name: "redis-replica", port: ports[1], args: func(dir string) []string {
		return append(serverArgs(dir, ports[1]), "--replicaof", proctest.Loopback, strconv.Itoa(ports[0]))
	}})
	if err != nil {
		return err
	}
	s.nodes = append(s.nodes, replica)
	if err := poll.Wait(ctx, "replica to follow the master", func(ctx context.Context) error {
		return linkUp(ctx, replica)
	}); err != nil {
		return fmt.Errorf("%w%s", err, logTails(s.nodes))
	}

	ids := make([]string, sentinelCount)
	for i := range ids {
		id := make([]byte, 20) // A sentinel's id is 40 hex digits.
		rand.Read(id)
		ids[i] = hex.EncodeToString(id)
	}
	cfgs := make([]nodeConfig, sentinelCount)
	for i := range cfgs {
		port := ports[2+i]
		// Sentinel mode of the redis-server binary: Debian's redis-server package has it, with
		// no need for the redis-sentinel package (a symlink and a service).
		cfgs[i] = nodeConfig{name: "sentinel", port: port,
			args: func(dir string) []string { return []string{filepath.Join(dir, "sentinel.conf"), "--sentinel"} },
			files: func(dir string) map[string]string {
				return map[string]string{"sentinel.conf": s.conf(dir, ports, ids, i, quorum)}
			},
		}
		s.SentinelAddrs = append(s.SentinelAddrs, proctest.Addr(port))
	}
	if s.sentinels, err = startNodes(cfgs); err != nil {
		return err
	}
	for _, addr := range s.SentinelAddrs {
		s.ask = append(s.ask, redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1,
			DialTimeout: askTimeout, ContextTimeoutEnabled: true}))
	}
	if err := poll.Wait(ctx, "sentinels to know the group", s.known); err != nil {
		return fmt.Errorf("%w%s", err, logTails(append(s.Nodes(), s.sentinels...)))
	}
	return nil
}

// conf is the sentinel.conf of sentinel i. It tells each sentinel the replica and the other
// sentinels up front, as the sentinel would write them itself once it found them, so that
// the group needs not wait for the sentinels' hello messages, sent every two seconds.
func (s *Sentinel) conf(dir string, ports []int, ids []string, i, quorum int) string {
	name := s.MasterName
	lines := []string{
		"bind " + proctest.Loopback,
		"port " + strconv.Itoa(ports[2+i]),
		"dir " + dir,
		"sentinel myid " + ids[i],
		"sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s %s %d %d", name, proctest.Loopback, ports[0], quorum),
		"sentinel down-after-milliseconds " + name + " 1000",
		"sentinel failover-timeout " + name + " 5000",
		fmt.Sprintf("sentinel known-replica %s %s %d", name, proctest.Loopback, ports[1]),
	}
	for j, id := range ids {
		if j != i {
			lines = append(lines, fmt.Sprintf("sentinel known-sentinel %s %s %d %s", name, proctest.Loopback, ports[2+j], id))
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// known reports why the sentinels do not know the group yet, or nil once every sentinel sees
// the master up, the replica following it and the other sentinels connected.
func (s *Sentinel) known(ctx context.Context) error {
	for i := range s.ask {
		if err := s.knows(ctx, i); err != nil {
			return fmt.Errorf("sentinel %s: %w", s.SentinelAddrs[i], err)
		}
	}
	return nil
}

// knows is known for sentinel i.
func (s *Sentinel) knows(ctx context.Context, i int) error {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	c, master, replica := s.ask[i], s.nodes[0].Addr, s.nodes[1].Addr
	m, err := c.Master(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if got := net.JoinHostPort(m["ip"], m["port"]); got != master || m["flags"] != "master" {
		return fmt.Errorf("master %s has flags %s", got, m["flags"])
	}
	replicas, err := c.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if len(replicas) != 1 || replicas[0]["name"] != replica || replicas[0]["flags"] != "slave" ||
		replicas[0]["master-link-status"] != "ok" {
		return fmt.Errorf("replicas are %v", replicas)
	}
	others, err := c.Sentinels(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if len(others) != sentinelCount-1 {
		return fmt.Errorf("knows %d other sentinels", len(others))
	}
	for _, o := range others {
		if o["flags"] != "sentinel" {
			return fmt.Errorf("sentinel %s has flags %s", o["name"], o["flags"])
		}
	}
	return nil
}

// MainSentinel is a TestMain helper: it starts a Sentinel group with quorum 2, runs the tests
// and closes the group. It sets *s before the tests run.
func MainSentinel(m interface{ Run() int }, s **Sentinel) int {
	return proctest.Main("redistest", m, s, func() (*Sentinel, error) { return StartSentinel(2) })
}

// Client returns a failover client of the group, configured as the checker configures its
// clients (context deadlines enforced); the caller closes it.
func (s *Sentinel) Client() *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName,
		SentinelAddrs: s.SentinelAddrs, ContextTimeoutEnabled: true})
}

// Nodes returns the group's master and replica as started: the first is the master until a
// failover.
func (s *Sentinel) Nodes() []*Node {
	return append([]*Node(nil), s.nodes...)
}

// Master returns the master as the running sentinels report it; they must agree.
func (s *Sentinel) Master(ctx context.Context) (*Node, error) {
	addr, err := s.masterAddr(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range s.nodes {
		if n.Addr == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("sentinels report master %s, which is no node of the group", addr)
}

// masterAddr is the master's address as every running sentinel reports it.
func (s *Sentinel) masterAddr(ctx context.Context) (string, error) {
	addr := ""
	for i := range s.ask {
		if !s.sentinels[i].running() {
			continue
		}
		got, err := s.reported(ctx, i)
		if err != nil {
			return "", fmt.Errorf("sentinel %s: master %s: %w", s.SentinelAddrs[i], s.MasterName, err)
		}
		if addr != "" && got != addr {
			return "", fmt.Errorf("sentinels disagree on the master: %s and %s", addr, got)
		}
		addr = got
	}
	if addr == "" {
		return "", errors.New("no sentinel runs")
	}
	return addr, nil
}

// reported is the master's address as sentinel i reports it.
func (s *Sentinel) reported(ctx context.Context, i int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	r, err := s.ask[i].GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", err
	}
	if len(r) != 2 {
		return "", fmt.Errorf("got %v, want host and port", r)
	}
	return net.JoinHostPort(r[0], r[1]), nil
}

// WaitFailover waits until every running sentinel reports a master other than oldMasterAddr
// and that master says it is one, and returns its address.
func (s *Sentinel) WaitFailover(ctx context.Context, oldMasterAddr string) (string, error) {
	var addr string
	err := poll.Wait(ctx, "failover from "+oldMasterAddr, func(ctx context.Context) error {
		var err error
		if addr, err = s.masterAddr(ctx); err != nil {
			return err
		}
		if addr == oldMasterAddr {
			return fmt.Errorf("sentinels still report master %s", addr)
		}
		for _, n := range s.nodes {
			if n.Addr == addr {
				repl, err := n.info(ctx, "replication")
				if err != nil {
					return err
				}
				if repl["role"] != "master" {
					return fmt.Errorf("new master %s says role:%s", addr, repl["role"])
				}
				return nil
			}
		}
		return fmt.Errorf("sentinels report master %s, which is no node of the group", addr)
	})
	if err != nil {
		return "", fmt.Errorf("%w%s", err, logTails(append(s.Nodes(), s.sentinels...)))
	}
	return addr, nil
}

// Close stops the sentinels and the nodes and removes their folders.
func (s *Sentinel) Close() {
	for _, c := range s.ask {
		c.Close()
	}
	closeNodes(append(s.Nodes(), s.sentinels...))
}

// linkUp reports whether replica n's link to its master is up.
func linkUp(ctx context.Context, n *Node) error {
	repl, err := n.info(ctx, "replication")
	if err != nil {
		return err
	}
	if repl["master_link_status"] != "up" {
		return fmt.Errorf("replica %s: link to master is %s", n.Addr, repl["master_link_status"])
	}
	return nil
}
