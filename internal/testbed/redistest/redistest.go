// Package redistest runs a real redis-server on a free loopback port for tests, and real
// groups of them: a Redis Cluster (StartCluster) and a Sentinel group (StartSentinel), whose
// nodes a test can kill and restart to see failovers.
//
// A test package starts one server from TestMain and shares it; tests isolate themselves by
// key prefix or by database number. A missing redis-server binary is a failure, never a skip:
// `make test` installs it.
package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Server is a redis-server process owned by a test package.
//
// Its Start (re)starts the process on the same port and waits until it answers PING; Stop
// kills the process (as a crash would) and waits for it to exit, and data is not kept; Close
// stops the server and removes its data.
type Server struct {
	// Addr is host:port of the server; it stays the same across Stop and Start.
	Addr string

	*proc
	tls bool
}

// setup runs redis-server as a cache that keeps nothing on disk: after Stop and Start, tests
// see an empty server, as the checker does after a real one crashes.
func setup(p *proctest.Process, dir string, ports []int) (*Server, proctest.Config, error) {
	s := &Server{Addr: proctest.Addr(ports[0]), proc: p}
	return s, proctest.Config{
		Name: "redis-server",
		Path: "redis-server",
		Args: []string{
			"--bind", proctest.Loopback,
			"--port", strconv.Itoa(ports[0]),
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
			"--databases", "64",
			"--protected-mode", "yes",
		},
		Ready: ping(s.Addr),
	}, nil
}

// Start launches redis-server on a free loopback port with its data in a temporary folder.
func Start() (*Server, error) {
	return proctest.Start("redis", 1, setup)
}

// StartTLS launches redis-server serving TLS only, with the key pair in certFile and keyFile;
// clients may present a certificate signed by caFile's CA (tls-auth-clients optional). URL
// then gives a rediss:// URL.
func StartTLS(certFile, keyFile, caFile string) (*Server, error) {
	return proctest.Start("redis-tls", 1, func(p *proctest.Process, dir string, ports []int) (*Server, proctest.Config, error) {
		s, cfg, err := setup(p, dir, ports)
		if err != nil {
			return nil, cfg, err
		}
		s.tls = true
		cfg.Args = append(cfg.Args[:2], append([]string{"--port", "0", "--tls-port", strconv.Itoa(ports[0]),
			"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
			"--tls-auth-clients", "optional"}, cfg.Args[4:]...)...)
		cfg.Ready = func(ctx context.Context) error {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return err
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(pem)
			c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: &tls.Config{RootCAs: roots, ServerName: proctest.Loopback}})
			defer c.Close()
			return c.Ping(ctx).Err()
		}
		return s, cfg, nil
	})
}

// Main is a TestMain helper: it starts a server, runs the tests and stops the server. It sets
// *srv before the tests run.
func Main(m interface{ Run() int }, srv **Server) int {
	return proctest.Main("redistest", m, srv, Start)
}

// URL is the redis:// (rediss:// with TLS) URL of database db on the server.
func (s *Server) URL(db int) string {
	scheme := "redis"
	if s.tls {
		scheme = "rediss"
	}
	return fmt.Sprintf("%s://%s/%d", scheme, s.Addr, db)
}

// Client returns a client for database db; the caller closes it.
func (s *Server) Client(db int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr, DB: db, ContextTimeoutEnabled: true})
}

// ping is the server's readiness check. Its client does not retry, so that Start sees each
// failure and can tell a dead server from a slow one.
func ping(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
}

// proc gives Server its Start, Stop and Close without adding exported fields to it.
type proc = proctest.Process
