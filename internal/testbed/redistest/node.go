package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Timing of the waits of clusters and Sentinel groups.
const (
	// groupTimeout bounds the start of a cluster or Sentinel group, from the first process to the
	// last replica attached: a cold start takes a few seconds, a loaded test machine more.
	groupTimeout = 30 * time.Second
	// askTimeout bounds one question to one server, so that a stalled server delays a wait by
	// this much instead of stopping it.
	askTimeout = time.Second
	// logTailSize bounds each node's part of an error: the lines a node logs as the group forms
	// or fails over.
	logTailSize = 1500
)

// Node is one redis-server of a cluster or a Sentinel group.
//
// It keeps its port and folder across Kill and Start, so that a restarted node finds its
// cluster configuration and rejoins the group; like Server, it keeps no data on disk.
type Node struct {
	// Addr is host:port of the node; it stays the same across Kill and Start.
	Addr string

	p   *proctest.Process
	log string // the file the node logs to, which outlives restarts and so tells the whole story

	// admin asks the node about its state; it does not retry, so that a poll sees each failure.
	admin *redis.Client

	mu   sync.Mutex
	down bool // killed by Kill and not started since
}

// nodeConfig says how to run one process of a group: its name in errors, its port, its
// arguments given its folder, and files to write in the folder before it starts.
type nodeConfig struct {
	name  string
	port  int
	args  func(dir string) []string
	files func(dir string) map[string]string
}

// startNode starts one process of a group and waits until it answers PING. The process logs
// to a file in its folder, which errors quote.
func startNode(cfg nodeConfig) (*Node, error) {
	addr := proctest.Addr(cfg.port)
	admin := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 2,
		DialTimeout: askTimeout, ContextTimeoutEnabled: true})
	n, err := proctest.Start(cfg.name, 0, func(p *proctest.Process, dir string, _ []int) (*Node, proctest.Config, error) {
		if cfg.files != nil {
			for name, text := range cfg.files(dir) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
					return nil, proctest.Config{}, fmt.Errorf("write %s of %s: %w", name, cfg.name, err)
				}
			}
		}
		log := filepath.Join(dir, "redis.log")
		return &Node{Addr: addr, p: p, log: log, admin: admin}, proctest.Config{
			Name:     cfg.name + " " + addr,
			Path:     "redis-server",
			Args:     append(cfg.args(dir), "--logfile", log),
			LogFiles: []string{log},
			Ready:    ping(addr),
		}, nil
	})
	if err != nil {
		admin.Close()
		return nil, err
	}
	return n, nil
}

// serverArgs are the arguments of a data node of a group: loopback only and nothing kept on
// disk, as Start's server. A replica syncs at once (no diskless-sync delay, which waits 5 s for
// more replicas) so that groups form and heal quickly.
func serverArgs(dir string, port int) []string {
	return []string{
		"--bind", proctest.Loopback,
		"--port", strconv.Itoa(port),
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "yes",
		"--repl-diskless-sync-delay", "0",
	}
}

// Kill kills the node as a crash would (SIGKILL) and waits for it to exit.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.p.Stop()
	n.down = true
}

// Start restarts a killed node on the same port and folder and waits until it answers PING. A
// cluster node reads its cluster configuration and rejoins by itself; Cluster.WaitHealthy
// waits until the cluster has taken it back.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.p.Start(); err != nil {
		return err
	}
	n.down = false
	return nil
}

// Client returns a client of this node alone; the caller closes it.
func (n *Node) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true})
}

// running reports whether the node runs, that is has not been killed since it last started.
func (n *Node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.down
}

// close stops the node and removes its folder.
func (n *Node) close() {
	n.admin.Close()
	n.p.Close()
}

// logTail is the end of the node's log, headed by its address.
func (n *Node) logTail() string {
	data, err := os.ReadFile(n.log)
	if err != nil {
		return fmt.Sprintf("--- %s: %v\n", n.Addr, err)
	}
	data = data[max(0, len(data)-logTailSize):]
	return fmt.Sprintf("--- %s\n%s\n", n.Addr, strings.TrimSpace(string(data)))
}

// info asks the node for an INFO section as its key:value lines.
func (n *Node) info(ctx context.Context, section string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	s, err := n.admin.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("info %s of %s: %w", section, n.Addr, err)
	}
	return fields(s), nil
}

// fields parses the key:value lines of INFO and CLUSTER INFO.
func fields(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// logTails joins the nodes' log tails, as the suffix of an error.
func logTails(nodes []*Node) string {
	var b strings.Builder
	b.WriteString("; log tails:\n")
	for _, n := range nodes {
		b.WriteString(n.logTail())
	}
	return b.String()
}

// closeNodes closes every node that is not nil, at once: each Close waits for its process.
func closeNodes(nodes []*Node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.close)
		}
	}
	wg.Wait()
}

// startNodes starts the nodes of cfgs side by side, since each start waits for its process; if
// one fails, it closes the others.
func startNodes(cfgs []nodeConfig) ([]*Node, error) {
	nodes := make([]*Node, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i, cfg := range cfgs {
		wg.Go(func() { nodes[i], errs[i] = startNode(cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeNodes(nodes)
		return nil, err
	}
	return nodes, nil
}
