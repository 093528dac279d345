package redistest

import (
	"errors"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// TopologyEnv selects the topology of the Redis a test package shares (MainShared): unset or
// "standalone" for one server, "cluster" for a Redis Cluster of three masters with a replica
// each. `make test` runs the packages whose tests are topology-neutral once with each, so that
// the same table tests prove the same promises on both.
const TopologyEnv = "QUOTAFLOW_TEST_REDIS"

// Shared is the Redis a test package shares. Its Server is always there, for the tests of
// what only one server has (database numbers, a server to stop); Cluster is set when the
// package runs on a cluster, and Client then reaches the cluster.
type Shared struct {
	*Server
	Cluster *Cluster
}

// MainShared is a TestMain helper like Main, for the topology TopologyEnv names. It sets *s
// before the tests run. An unknown topology fails the run, naming the variable.
func MainShared(m interface{ Run() int }, s **Shared) int {
	topology := os.Getenv(TopologyEnv)
	if topology != "" && topology != "standalone" && topology != "cluster" {
		fmt.Fprintf(os.Stderr, "redistest: %s=%q: want standalone or cluster\n", TopologyEnv, topology)
		return 2
	}
	return proctest.Main("redistest", m, s, func() (*Shared, error) {
		srv, err := Start()
		if err != nil {
			return nil, err
		}
		sh := &Shared{Server: srv}
		if topology == "cluster" {
			if sh.Cluster, err = StartCluster(3, 1); err != nil {
				srv.Close()
				return nil, errors.Join(errors.New("start the shared cluster"), err)
			}
		}
		return sh, nil
	})
}

// Close stops the server and the cluster.
func (s *Shared) Close() {
	if s.Cluster != nil {
		s.Cluster.Close()
	}
	s.Server.Close()
}

// Topology names what Client reaches: "cluster" or "standalone".
func (s *Shared) Topology() string {
	if s.Cluster != nil {
		return "cluster"
	}
	return "standalone"
}

// UniversalClient returns a client of the shared topology, configured as the checker
// configures its clients (context deadlines enforced); the caller closes it.
func (s *Shared) UniversalClient() redis.UniversalClient {
	if s.Cluster != nil {
		return s.Cluster.Client()
	}
	return redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
}
