// Package clickhousetest runs a real clickhouse-server (Debian's package) on a free loopback
// port for tests, or several as the replicas of a cluster (StartCluster).
//
// A test package starts one server from TestMain and shares it; tests isolate themselves by
// database name. A missing clickhouse-server binary is a failure, never a skip: `make test`
// installs it.
package clickhousetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Server is a clickhouse-server process owned by a test package. Its data survives Stop and
// Start, as a real server's does across a crash.
//
// Its Start (re)starts the process on the same port and data and waits until it answers; Stop
// kills the process (as a crash would) and waits for it to exit; Close stops the server and
// removes its data.
type Server struct {
	// Addr is host:port of the native protocol; it stays the same across Stop and Start.
	Addr string
	// SecureAddr is host:port of the native protocol over TLS (StartTLS only).
	SecureAddr string

	*proc
}

// setup runs clickhouse-server from a config in dir that has it serve the native protocol on
// ports[0] and HTTP on ports[1].
func setup(p *proctest.Process, dir string, ports []int) (*Server, proctest.Config, error) {
	if err := writeConfig(dir, ports[0], ports[1], ""); err != nil {
		return nil, proctest.Config{}, err
	}
	s := &Server{Addr: proctest.Addr(ports[0]), proc: p}
	return s, proctest.Config{
		Name:     "clickhouse-server",
		Path:     "clickhouse-server",
		Search:   []string{"/usr/sbin"}, // Debian's place for it, which a user's PATH may lack
		Args:     []string{"--config-file=" + filepath.Join(dir, "config.xml")},
		Dir:      dir,
		LogFiles: []string{filepath.Join(dir, "error.log")},
		Ready:    ping(s.Addr),
		// A first start creates the system tables, which takes seconds on a slow machine.
		Timeout: 60 * time.Second,
		Poll:    50 * time.Millisecond,
	}, nil
}

// Start launches clickhouse-server on a free loopback port with its data in a temporary folder.
func Start() (*Server, error) {
	return proctest.Start("clickhouse", 2, setup)
}

// StartTLS launches clickhouse-server as Start does, also serving the native protocol over TLS
// on SecureAddr with the key pair in certFile and keyFile.
func StartTLS(certFile, keyFile string) (*Server, error) {
	return proctest.Start("clickhouse-tls", 3, func(p *proctest.Process, dir string, ports []int) (*Server, proctest.Config, error) {
		extra := fmt.Sprintf(`    <tcp_port_secure>%d</tcp_port_secure>
    <openSSL><server><certificateFile>%s</certificateFile><privateKeyFile>%s</privateKeyFile><verificationMode>none</verificationMode><loadDefaultCAFile>false</loadDefaultCAFile><disableProtocols>sslv2,sslv3</disableProtocols></server></openSSL>
`, ports[2], certFile, keyFile)
		s, cfg, err := setup(p, dir, ports)
		if err != nil {
			return nil, cfg, err
		}
		if err := writeConfig(dir, ports[0], ports[1], extra); err != nil { // setup's, with TLS
			return nil, proctest.Config{}, err
		}
		s.SecureAddr = proctest.Addr(ports[2])
		return s, cfg, nil
	})
}

// Main is a TestMain helper: it starts a server, runs the tests and stops the server. It sets
// *srv before the tests run.
func Main(m interface{ Run() int }, srv **Server) int {
	return proctest.Main("clickhousetest", m, srv, Start)
}

// writeConfig writes a minimal config.xml and users.xml for a loopback-only server with its
// data, logs and temporary files under dir. deploy/dev/run.sh writes the same files for
// `make dev`; keep the two in step.
func writeConfig(dir string, tcpPort, httpPort int, extra string) error {
	config := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><log>%[1]s/server.log</log><errorlog>%[1]s/error.log</errorlog><console>0</console></logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>%[2]d</tcp_port>
    <http_port>%[3]d</http_port>
    <path>%[1]s/data/</path>
    <tmp_path>%[1]s/tmp/</tmp_path>
    <user_files_path>%[1]s/user_files/</user_files_path>
    <format_schema_path>%[1]s/format_schemas/</format_schema_path>
    <mark_cache_size>67108864</mark_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
%[4]s</yandex>
`, dir, tcpPort, httpPort, extra)
	users := `<?xml version="1.0"?>
<yandex>
    <profiles><default></default></profiles>
    <users><default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default></users>
    <quotas><default></default></quotas>
</yandex>
`
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("clickhouse config dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(config), 0o644); err != nil {
		return fmt.Errorf("clickhouse config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(users), 0o644); err != nil {
		return fmt.Errorf("clickhouse users: %w", err)
	}
	return nil
}

// DSN is the clickhouse:// DSN of database db on the server.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("clickhouse://%s/%s?dial_timeout=2s", s.Addr, db)
}

// Conn opens a native connection to the server's default database; the caller closes it.
func (s *Server) Conn() (driver.Conn, error) {
	return open(s.Addr)
}

// pingTimeout bounds one readiness check: a starting server may accept the connection and
// answer only once it has loaded its tables.
const pingTimeout = 2 * time.Second

// ping is the server's readiness check.
func ping(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		conn, err := open(addr)
		if err != nil {
			return fmt.Errorf("clickhouse options: %w", err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(ctx, pingTimeout)
		defer cancel()
		return conn.Ping(ctx)
	}
}

// open opens a native connection to the server at addr.
func open(addr string) (driver.Conn, error) {
	return clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 2 * time.Second})
}

// proc gives Server its Start, Stop and Close without adding exported fields to it.
type proc = proctest.Process
