// Package zookeepertest runs a real standalone ZooKeeper (Debian's package, on Java) on a free
// loopback port for tests: the coordination service of replicated ClickHouse tables.
//
// Debian's zookeeper package installs the server as /usr/share/java/zookeeper.jar, whose
// manifest names its dependencies' jars in /usr/share/java, and an example configuration in
// /etc/zookeeper; its service is not needed (nor, where systemd is missing, started). Start
// runs java on that jar with a zoo.cfg of its own in a temporary folder, which also holds the
// data: no root needed. A missing java or zookeeper package is a failure, never a skip:
// `make test` installs them.
package zookeepertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// Jar is the ZooKeeper server's jar as Debian's zookeeper package installs it.
const Jar = "/usr/share/java/zookeeper.jar"

// logBinding is the slf4j binding that makes ZooKeeper log to its stderr (and so into
// proctest's error tails); without one it logs nothing. Debian's libslf4j-java, which the
// zookeeper package depends on, ships it.
const logBinding = "/usr/share/java/slf4j-simple.jar"

// Server is a ZooKeeper process owned by a test. Its data survives Stop and Start.
//
// Its Start (re)starts the process on the same port and data and waits until it serves; Stop
// kills it (as a crash would); Close stops it and removes its data.
type Server struct {
	// Addr is host:port of the client port.
	Addr string

	*proc
}

// Start launches a standalone ZooKeeper on a free loopback port with its data in a temporary
// folder and waits until it serves requests.
func Start() (*Server, error) {
	return proctest.Start("zookeeper", 1, setup)
}

func setup(p *proctest.Process, dir string, ports []int) (*Server, proctest.Config, error) {
	if _, err := os.Stat(Jar); err != nil {
		return nil, proctest.Config{}, fmt.Errorf("zookeeper not installed (run `make test`, which installs Debian's zookeeper package): %w", err)
	}
	// tickTime 500ms: sessions may last 1 to 10 s, so that a test's servers notice a lost
	// session in seconds. The AdminServer (Jetty on 8080) stays off; srvr tells readiness.
	cfg := fmt.Sprintf(`tickTime=500
dataDir=%s
clientPort=%d
clientPortAddress=%s
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,mntr
`, filepath.Join(dir, "data"), ports[0], proctest.Loopback)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, proctest.Config{}, fmt.Errorf("zookeeper data dir: %w", err)
	}
	cfgFile := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		return nil, proctest.Config{}, fmt.Errorf("zookeeper config: %w", err)
	}
	classpath := Jar
	if _, err := os.Stat(logBinding); err == nil {
		classpath += ":" + logBinding
	}
	s := &Server{Addr: proctest.Addr(ports[0]), proc: p}
	return s, proctest.Config{
		Name:   "zookeeper",
		Path:   "java",
		Search: []string{"/usr/bin"},
		Args: []string{
			// A small heap and a quick-starting JVM: the tests' ZooKeeper holds a few hundred
			// nodes, and the machine is shared with the ClickHouse servers using it.
			"-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
			"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
			"-Djava.io.tmpdir=" + dir,
			"-cp", classpath,
			"org.apache.zookeeper.server.ZooKeeperServerMain", cfgFile,
		},
		Dir:     dir,
		Ready:   Serving(s.Addr),
		Timeout: 30 * time.Second,
		Poll:    50 * time.Millisecond,
	}, nil
}

// Serving is a readiness check: ZooKeeper answers the four-letter command srvr with its mode
// once it serves requests (ruok answers imok before that).
func Serving(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		if _, err := io.WriteString(c, "srvr"); err != nil {
			return err
		}
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Mode: ") {
				return nil
			}
		}
		if err := sc.Err(); err != nil {
			return err
		}
		return errors.New("zookeeper is not serving requests yet")
	}
}

// proc gives Server its Start, Stop and Close without adding exported fields to it.
type proc = proctest.Process
