// Package clickhousetest runs a real clickhouse-server (Debian's package) on a free loopback
// port for tests.
//
// A test package starts one server from TestMain and shares it; tests isolate themselves by
// database name. A missing clickhouse-server binary is a failure, never a skip: `make test`
// installs it.
package clickhousetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Server is a clickhouse-server process owned by a test package. Its data survives Stop and
// Start, as a real server's does across a crash.
type Server struct {
	// Addr is host:port of the native protocol; it stays the same across Stop and Start.
	Addr string

	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start launches clickhouse-server on a free loopback port with its data in a temporary folder.
func Start() (*Server, error) {
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quotaflow-clickhouse-")
	if err != nil {
		return nil, fmt.Errorf("create clickhouse data dir: %w", err)
	}
	tcp, err := freePort()
	if err != nil {
		return nil, err
	}
	http, err := freePort()
	if err != nil {
		return nil, err
	}
	if err := writeConfig(dir, tcp, http); err != nil {
		return nil, err
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp)), dir: dir}
	if err := s.start(bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Main is a TestMain helper: it starts a server, runs the tests and stops the server. It sets
// *srv before the tests run.
func Main(m interface{ Run() int }, srv **Server) int {
	s, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clickhousetest:", err)
		return 1
	}
	*srv = s
	code := m.Run()
	s.Close()
	return code
}

// binary finds clickhouse-server; Debian installs it in /usr/sbin, which a user's PATH may lack.
func binary() (string, error) {
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/clickhouse-server"); err == nil {
		return "/usr/sbin/clickhouse-server", nil
	}
	return "", errors.New("clickhouse-server not found (run `make test`, which installs it)")
}

// writeConfig writes a minimal config.xml and users.xml for a loopback-only server with its
// data, logs and temporary files under dir. deploy/dev/run.sh writes the same files for
// `make dev`; keep the two in step.
func writeConfig(dir string, tcpPort, httpPort int) error {
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
</yandex>
`, dir, tcpPort, httpPort)
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
	return clickhouse.Open(&clickhouse.Options{Addr: []string{s.Addr}, DialTimeout: 2 * time.Second})
}

// Start (re)starts the process on the same port and data and waits until it answers.
func (s *Server) Start() error {
	bin, err := binary()
	if err != nil {
		return err
	}
	return s.start(bin)
}

func (s *Server) start(bin string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(bin, "--config-file="+filepath.Join(s.dir, "config.xml"))
	cmd.Dir = s.dir
	out, err := os.OpenFile(filepath.Join(s.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("clickhouse stdout: %w", err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start clickhouse-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	conn, err := s.Conn()
	if err != nil {
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("clickhouse options: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := conn.Ping(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("clickhouse-server exited at start: %s", s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("clickhouse-server did not answer within 60s: %v; %s", err, s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.cmd, s.done = cmd, done
	return nil
}

func (s *Server) logTail() string {
	var b strings.Builder
	for _, f := range []string{"stdout.log", "error.log"} {
		data, _ := os.ReadFile(filepath.Join(s.dir, f))
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		b.Write(data)
	}
	return b.String()
}

// Stop kills the process (as a crash would) and waits for it to exit. Data is kept.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
