package clickhousetest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Cluster is clickhouse-server processes run as the replicas of one shard of a cluster, which
// share a ZooKeeper: what replicated tables, ON CLUSTER statements and Distributed tables
// need. Each replica is a Server of its own, with its own data, that a test can Stop and Start.
type Cluster struct {
	// Name is the cluster's name in every replica's remote_servers.
	Name string
	// Replicas are the servers, with the macros shard=1 and replica=replica1, replica2, ...
	Replicas []*Server
}

// clusterName keeps a cluster's name to what is a valid XML element name and needs no quoting
// in SQL.
var clusterName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// StartCluster launches n clickhouse-server replicas of one shard of the cluster name, in
// parallel, each on free loopback ports with its data in a temporary folder, and waits until
// every one answers. zkAddr is the host:port of the ZooKeeper they share. Each gets the
// single server's config plus config.d/cluster.xml: remote_servers (the one shard, with
// internal_replication, so that a Distributed table leaves replication to the replicated
// tables), the zookeeper section, its macros, the distributed DDL queue and its interserver
// HTTP port, through which replicas fetch parts from each other.
func StartCluster(name, zkAddr string, n int) (*Cluster, error) {
	if !clusterName.MatchString(name) {
		return nil, fmt.Errorf("cluster name %q: want letters, digits and '_'", name)
	}
	if n < 1 {
		return nil, fmt.Errorf("cluster %s: want at least one replica, got %d", name, n)
	}
	zkHost, zkPort, err := net.SplitHostPort(zkAddr)
	if err != nil {
		return nil, fmt.Errorf("zookeeper address %q: %w", zkAddr, err)
	}
	// Every replica's config names every replica's native port, so all ports are taken
	// before the first server starts: three per replica, native, HTTP and interserver HTTP.
	ports, err := proctest.FreePorts(3 * n)
	if err != nil {
		return nil, err
	}
	var replicas strings.Builder
	for i := range n {
		fmt.Fprintf(&replicas, "\n            <replica><host>%s</host><port>%d</port></replica>", proctest.Loopback, ports[3*i])
	}
	c := &Cluster{Name: name, Replicas: make([]*Server, n)}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := ports[3*i : 3*i+3]
			c.Replicas[i], errs[i] = proctest.Start(fmt.Sprintf("clickhouse-%s-replica%d", name, i+1), 0,
				func(p *proctest.Process, dir string, _ []int) (*Server, proctest.Config, error) {
					clusterXML := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
    <interserver_http_host>%[1]s</interserver_http_host>
    <interserver_http_port>%[2]d</interserver_http_port>
    <zookeeper>
        <node><host>%[3]s</host><port>%[4]s</port></node>
        <session_timeout_ms>%[5]d</session_timeout_ms>
    </zookeeper>
    <remote_servers>
        <%[6]s>
            <shard>
            <internal_replication>true</internal_replication>%[7]s
            </shard>
        </%[6]s>
    </remote_servers>
    <macros><shard>1</shard><replica>replica%[8]d</replica></macros>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
</yandex>
`, proctest.Loopback, own[2], zkHost, zkPort, SessionTimeout.Milliseconds(), name, replicas.String(), i+1)
					if err := os.MkdirAll(filepath.Join(dir, "config.d"), 0o755); err != nil {
						return nil, proctest.Config{}, fmt.Errorf("clickhouse config.d: %w", err)
					}
					if err := os.WriteFile(filepath.Join(dir, "config.d", "cluster.xml"), []byte(clusterXML), 0o644); err != nil {
						return nil, proctest.Config{}, fmt.Errorf("clickhouse cluster config: %w", err)
					}
					return setup(p, dir, own[:2])
				})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster %s: %w", name, err)
		}
	}
	return c, nil
}

// SessionTimeout is the replicas' ZooKeeper session timeout. A killed replica's session, and
// with it its mark as an active replica, outlives it by up to this long; a restarted replica
// serves its replicated tables read-only until then. Short, so that restart tests stay fast;
// long enough for a loaded test machine to keep its sessions.
const SessionTimeout = 4 * time.Second

// Close stops every replica and removes its data.
func (c *Cluster) Close() {
	for _, r := range c.Replicas {
		if r != nil {
			r.Close()
		}
	}
}
