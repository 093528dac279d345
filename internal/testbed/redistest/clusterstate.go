package redistest

import (
	"context"
	"errors"
	"fmt"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	"slices"
	"strconv"
	"strings"
)

// slotCount is the number of hash slots of every Redis Cluster.
const slotCount = 16384

// clusterNode is one line of CLUSTER NODES: a node as another node (or itself) sees it.
type clusterNode struct {
	id, addr  string
	flags     []string // master, slave, myself, fail, fail? (suspected), handshake, noaddr...
	master    string   // id of the master of a replica, or "-"
	connected bool     // the link of the seeing node to this one is up
	slots     [][2]int // first and last slot of each range it serves
}

func (e clusterNode) is(flag string) bool { return slices.Contains(e.flags, flag) }

// owns reports whether the node serves slot.
func (e clusterNode) owns(slot int) bool {
	for _, r := range e.slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// parseClusterNodes parses the reply of CLUSTER NODES.
func parseClusterNodes(s string) ([]clusterNode, error) {
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("cluster nodes line %q: want 8 or more fields", line)
		}
		addr, _, _ := strings.Cut(f[1], "@") // host:port@busport[,hostname]
		e := clusterNode{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3], connected: f[7] == "connected"}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // A slot being migrated or imported: it is still served where it was.
			}
			first, last, _ := strings.Cut(r, "-")
			if last == "" {
				last = first
			}
			a, err1 := strconv.Atoi(first)
			b, err2 := strconv.Atoi(last)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("cluster nodes slots %q: %w", r, err)
			}
			e.slots = append(e.slots, [2]int{a, b})
		}
		nodes = append(nodes, e)
	}
	return nodes, nil
}

// view is the cluster as n sees it.
func (n *Node) view(ctx context.Context) ([]clusterNode, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	s, err := n.admin.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster nodes of %s: %w", n.Addr, err)
	}
	return parseClusterNodes(s)
}

// anyView is the cluster as the first running node that answers sees it.
func (c *Cluster) anyView(ctx context.Context) (*Node, []clusterNode, error) {
	var errs []error
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		v, err := n.view(ctx)
		if err == nil {
			return n, v, nil
		}
		errs = append(errs, err)
	}
	return nil, nil, fmt.Errorf("no cluster node answered: %w", errors.Join(errs...))
}

// health reports why the cluster is not healthy, or nil if it is: every running node says
// cluster_state:ok with every slot served, all see the same masters and replicas, every slot
// is served by a running master, no running node is suspected or failed, and every running
// replica has its link to its master up. If formed, every master must also have all the
// replicas asked for, as after StartCluster.
func (c *Cluster) health(ctx context.Context, formed bool) error {
	var want string
	var wantFrom *Node
	var shape []clusterNode
	for _, n := range c.nodes {
		if !n.running() {
			continue
		}
		if err := c.nodeHealth(ctx, n); err != nil {
			return err
		}
		v, err := n.view(ctx)
		if err != nil {
			return err
		}
		s, running, err := c.shape(n, v)
		if err != nil {
			return err
		}
		if wantFrom == nil {
			want, wantFrom, shape = s, n, running
		} else if s != want {
			return fmt.Errorf("%s and %s see different clusters:\n%s\n%s", wantFrom.Addr, n.Addr, want, s)
		}
	}
	if wantFrom == nil {
		return errors.New("no cluster node runs")
	}
	if formed {
		for _, m := range shape {
			if !m.is("master") {
				continue
			}
			got := 0
			for _, r := range shape {
				if r.master == m.id {
					got++
				}
			}
			if got != c.replicas {
				return fmt.Errorf("master %s has %d replicas, want %d", m.addr, got, c.replicas)
			}
		}
	}
	return nil
}

// nodeHealth checks what n says of itself: the cluster is ok, and its replication link is up
// if it is a replica.
func (c *Cluster) nodeHealth(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	s, err := n.admin.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster info of %s: %w", n.Addr, err)
	}
	info := fields(s)
	for k, want := range map[string]string{
		"cluster_state":       "ok",
		"cluster_slots_ok":    strconv.Itoa(slotCount),
		"cluster_known_nodes": strconv.Itoa(len(c.nodes)),
	} {
		if info[k] != want {
			return fmt.Errorf("%s says %s:%s, want %s", n.Addr, k, info[k], want)
		}
	}
	repl, err := n.info(ctx, "replication")
	if err != nil {
		return err
	}
	if repl["role"] == "slave" && repl["master_link_status"] != "up" {
		return fmt.Errorf("replica %s: link to master %s:%s is %s", n.Addr,
			repl["master_host"], repl["master_port"], repl["master_link_status"])
	}
	return nil
}

// shape checks the view of seer and returns its running nodes, as text to compare with other
// views and as lines.
func (c *Cluster) shape(seer *Node, view []clusterNode) (string, []clusterNode, error) {
	var running []clusterNode
	for _, e := range view {
		n := c.node(e.addr)
		if n == nil {
			return "", nil, fmt.Errorf("%s sees %s, which is no node of the cluster", seer.Addr, e.addr)
		}
		if !n.running() {
			if len(e.slots) > 0 {
				return "", nil, fmt.Errorf("%s sees slots served by %s, which is down", seer.Addr, e.addr)
			}
			continue
		}
		if !e.connected || e.is("fail") || e.is("fail?") || e.is("handshake") || e.is("noaddr") {
			return "", nil, fmt.Errorf("%s sees %s with flags %s, link connected %t",
				seer.Addr, e.addr, strings.Join(e.flags, ","), e.connected)
		}
		running = append(running, e)
	}
	slices.SortFunc(running, func(a, b clusterNode) int { return strings.Compare(a.addr, b.addr) })
	var b strings.Builder
	for _, e := range running {
		role := "master"
		if e.is("slave") {
			role = "replica of " + e.master
		}
		fmt.Fprintf(&b, "%s %s %s %v\n", e.id, e.addr, role, e.slots)
	}
	return b.String(), running, nil
}

// WaitHealthy waits until the cluster is healthy again, as after a failover, a restart or a
// reshard: every running node says cluster_state:ok, all agree on who serves which slot, every
// slot is served by a running master, and every running replica follows its master. A killed
// node may stay down.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	if err := poll.Wait(ctx, "healthy cluster", func(ctx context.Context) error { return c.health(ctx, false) }); err != nil {
		return fmt.Errorf("%w%s", err, logTails(c.nodes))
	}
	return nil
}

// Masters returns the masters that serve slots, as a running node sees them, in the order of
// Addrs.
func (c *Cluster) Masters(ctx context.Context) ([]*Node, error) {
	_, view, err := c.anyView(ctx)
	if err != nil {
		return nil, err
	}
	var masters []*Node
	for _, n := range c.nodes {
		for _, e := range view {
			if e.addr == n.Addr && e.is("master") && !e.is("fail") && len(e.slots) > 0 {
				masters = append(masters, n)
			}
		}
	}
	return masters, nil
}

// SlotOwners returns, for each of the 16384 slots, the address of the master serving it as a
// running node sees it ("" for a slot nobody serves).
func (c *Cluster) SlotOwners(ctx context.Context) ([]string, error) {
	_, view, err := c.anyView(ctx)
	if err != nil {
		return nil, err
	}
	owners := make([]string, slotCount)
	for _, e := range view {
		if !e.is("master") {
			continue
		}
		for _, r := range e.slots {
			for slot := r[0]; slot <= r[1]; slot++ {
				owners[slot] = e.addr
			}
		}
	}
	return owners, nil
}

// MasterOf returns the master that serves the slot of key, as a running node sees it.
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Node, error) {
	n, view, err := c.anyView(ctx)
	if err != nil {
		return nil, err
	}
	slot, err := n.admin.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("slot of %q: %w", key, err)
	}
	for _, e := range view {
		if e.is("master") && e.owns(int(slot)) {
			if m := c.node(e.addr); m != nil {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("%s knows no master of slot %d (key %q)", n.Addr, slot, key)
}

// Reshard moves slots hash slots, with their keys, from the master at fromAddr to the master
// at toAddr with `redis-cli --cluster reshard`, and waits until the cluster is healthy again.
// redis-cli moves the source's lowest slots first, and its keys one per MIGRATE: the keys of
// one slot are split between the two masters for a while, which is when a multi-key command
// meets TRYAGAIN.
// It first waits for a healthy cluster, since redis-cli refuses to reshard one whose nodes
// disagree.
func (c *Cluster) Reshard(ctx context.Context, fromAddr, toAddr string, slots int) error {
	if err := c.WaitHealthy(ctx); err != nil {
		return err
	}
	_, view, err := c.anyView(ctx)
	if err != nil {
		return err
	}
	ids := map[string]string{}
	for _, e := range view {
		if e.is("master") {
			ids[e.addr] = e.id
		}
	}
	for _, addr := range []string{fromAddr, toAddr} {
		if ids[addr] == "" {
			return fmt.Errorf("reshard: %s is no master of the cluster", addr)
		}
	}
	if err := redisCLI(ctx, "--cluster", "reshard", fromAddr, "--cluster-from", ids[fromAddr],
		"--cluster-to", ids[toAddr], "--cluster-slots", strconv.Itoa(slots), "--cluster-pipeline", "1", "--cluster-yes"); err != nil {
		return fmt.Errorf("reshard %d slots from %s to %s: %w", slots, fromAddr, toAddr, err)
	}
	return c.WaitHealthy(ctx)
}
