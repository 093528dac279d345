package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// clusterName is the name of every cluster StartCluster makes.
const clusterName = "quotaflow-test"

// childSpec is what a re-executed test binary serves (childEnv, JSON): a server on Port with
// its store in Dir and, in a cluster, its name, cluster port and routes to the other nodes.
type childSpec struct {
	Port        int      `json:"port"`
	Dir         string   `json:"dir"`
	Name        string   `json:"name,omitempty"`
	ClusterPort int      `json:"cluster_port,omitempty"`
	Routes      []string `json:"routes,omitempty"`
}

// options are the server options of spec: JetStream with the store in spec.Dir, and the
// cluster block when spec names a cluster port.
func (spec childSpec) options() (*server.Options, error) {
	opts := &server.Options{
		ServerName: spec.Name, Host: proctest.Loopback, Port: spec.Port,
		JetStream: true, StoreDir: filepath.Clean(spec.Dir), NoLog: true, NoSigs: true,
	}
	if spec.ClusterPort == 0 {
		return opts, nil
	}
	opts.Cluster = server.ClusterOpts{Name: clusterName, Host: proctest.Loopback, Port: spec.ClusterPort}
	for _, r := range spec.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("route %q: %w", r, err)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return opts, nil
}

// Cluster is a NATS cluster of nats-server processes with JetStream (the test binary
// re-executed, as StartProcess does), each routed to all the others, each with its store in a
// folder of its own. A test kills a node (Nodes[i].Stop, SIGKILL) and starts it again on the
// same ports and store to see the cluster lose and regain a member.
type Cluster struct {
	// Nodes are the servers; Nodes[i].URL is the client URL of the i-th.
	Nodes []*Process
	// Names are the servers' names, as JetStream reports stream and consumer leaders and peers.
	Names []string
}

// StartCluster starts an n-node cluster and waits until JetStream has a meta leader with every
// node as a current peer. The test binary's TestMain must call Main.
func StartCluster(n int) (*Cluster, error) {
	ports, err := proctest.FreePorts(2 * n) // a client port and a cluster port per node
	if err != nil {
		return nil, err
	}
	routes := make([]string, n)
	for i := range n {
		routes[i] = "nats-route://" + proctest.Addr(ports[n+i])
	}
	c := &Cluster{Nodes: make([]*Process, n), Names: make([]string, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		c.Names[i] = "n" + strconv.Itoa(i)
		spec := childSpec{Port: ports[i], Name: c.Names[i], ClusterPort: ports[n+i],
			Routes: append(append([]string(nil), routes[:i]...), routes[i+1:]...)}
		wg.Go(func() {
			c.Nodes[i], errs[i] = proctest.Start("nats-cluster", 0, func(p *proctest.Process, dir string, _ []int) (*Process, proctest.Config, error) {
				spec.Dir = dir
				return setupSpec(p, spec)
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// URL is the cluster's client URLs, comma-separated, as --nats-url takes them.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// Connect returns a connection to any node of the cluster that reconnects forever.
func (c *Cluster) Connect() (*nats.Conn, error) {
	return nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1))
}

// JetStream returns a JetStream client of the cluster over a connection that reconnects
// forever (Connect); the connection ends with the test.
func (c *Cluster) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return jetStreamOver(t, c.Connect)
}

// WaitReady waits until JetStream can place a stream on every node: after StartCluster, and
// after a node is started again.
func (c *Cluster) WaitReady(ctx context.Context) error {
	nc, err := c.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var last error
	for {
		if last = c.placeable(ctx, js); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats cluster not whole: %w", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// placeable creates and deletes a stream with a replica on every node: only a cluster with a
// meta leader that counts every node as a live peer can.
func (c *Cluster) placeable(ctx context.Context, js jetstream.JetStream) error {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	const probe = "NATSTEST_READY"
	if _, err := js.CreateStream(actx, jetstream.StreamConfig{Name: probe, Subjects: []string{"natstest.ready"},
		Replicas: len(c.Nodes), Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("place a %d-replica stream: %w", len(c.Nodes), err)
	}
	if err := js.DeleteStream(actx, probe); err != nil {
		return fmt.Errorf("delete the probe stream: %w", err)
	}
	return nil
}

// Close stops every node and removes their stores.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		if n != nil {
			n.Close()
		}
	}
}

// setupSpec re-executes the test binary, told by childEnv to serve spec.
func setupSpec(p *proctest.Process, spec childSpec) (*Process, proctest.Config, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, proctest.Config{}, err
	}
	return &Process{URL: natsURL(spec.Port), proc: p}, proctest.Config{
		Name: "nats-server process " + spec.Name,
		Path: os.Args[0],
		Env:  []string{childEnv + "=" + string(b)},
		// The child prints nothing unless it fails; then the test's output should show why.
		Output:  os.Stderr,
		Ready:   proctest.Listening(proctest.Addr(spec.Port)),
		Timeout: 15 * time.Second,
	}, nil
}
