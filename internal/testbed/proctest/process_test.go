package proctest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// listenEnv makes the test binary, started by a test as its server, listen on the port it names
// until it is killed.
const listenEnv = "PROCTEST_LISTEN"

func TestMain(m *testing.M) {
	if port := os.Getenv(listenEnv); port != "" {
		l, err := net.Listen("tcp", net.JoinHostPort(proctest.Loopback, port))
		if err != nil {
			os.Exit(1)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			c.Close()
		}
	}
	os.Exit(m.Run())
}

// server is what the tests' setup funcs make: the process and the folder and ports it got.
type server struct {
	p     *proctest.Process
	dir   string
	ports []int
}

// start starts a server that cfg describes, with two ports to check that they differ.
func start(t *testing.T, cfg func(dir string, ports []int) proctest.Config) (*server, error) {
	t.Helper()
	setup := func(p *proctest.Process, dir string, ports []int) (*server, proctest.Config, error) {
		return &server{p: p, dir: dir, ports: ports}, cfg(dir, ports), nil
	}
	return proctest.Start("proctest", 2, setup)
}

func listener(_ string, ports []int) proctest.Config {
	return proctest.Config{
		Name:  "listener",
		Path:  os.Args[0],
		Env:   []string{listenEnv + "=" + strconv.Itoa(ports[0])},
		Ready: proctest.Listening(proctest.Addr(ports[0])),
	}
}

func TestRestartOnSamePort(t *testing.T) {
	s, err := start(t, listener)
	if err != nil {
		t.Fatal(err)
	}
	if s.ports[0] == s.ports[1] {
		t.Errorf("ports %v are not distinct", s.ports)
	}
	addr := proctest.Addr(s.ports[0])
	ready := proctest.Listening(addr)
	s.p.Stop()
	if err := ready(context.Background()); err == nil {
		t.Fatalf("%s still accepts connections after Stop", addr)
	}
	if err := s.p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ready(context.Background()); err != nil {
		t.Fatalf("%s after Start: %v", addr, err)
	}
	s.p.Close()
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left %s: %v", s.dir, err)
	}
}

func TestStartFails(t *testing.T) {
	neverReady := func(context.Context) error { return errors.New("not yet") }
	for _, tt := range []struct {
		name string
		cfg  proctest.Config
		want []string
	}{{
		name: "exits",
		cfg: proctest.Config{
			Name:  "sh",
			Path:  "sh",
			Args:  []string{"-c", "echo cannot bind; exit 3"},
			Ready: neverReady,
		},
		want: []string{"sh exited at start (exit status 3)", "cannot bind"},
	}, {
		name: "times out",
		cfg: proctest.Config{
			Name:    "sh",
			Path:    "sh",
			Args:    []string{"-c", "echo loading; exec sleep 60"},
			Ready:   neverReady,
			Timeout: 300 * time.Millisecond,
		},
		want: []string{"sh did not answer within 0.3s: not yet", "loading"},
	}, {
		name: "missing",
		cfg:  proctest.Config{Name: "nothing", Path: "proctest-no-such-server"},
		want: []string{"proctest-no-such-server not found (run `make test`"},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			var dir string
			_, err := start(t, func(d string, _ []int) proctest.Config {
				dir = d
				return tt.cfg
			})
			if err == nil {
				t.Fatal("Start succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("failed Start left %s: %v", dir, err)
			}
		})
	}
}

// TestFreePorts: the ports are distinct, free (a server can bind each) and outside the
// system's ephemeral range, where outgoing connections take their source ports.
func TestFreePorts(t *testing.T) {
	t.Parallel()
	ports, err := proctest.FreePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	ephemeral := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &ephemeral)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d handed out twice", p)
		}
		seen[p] = true
		if p >= ephemeral {
			t.Errorf("port %d is in the ephemeral range (from %d)", p, ephemeral)
		}
		l, err := net.Listen("tcp", proctest.Addr(p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}
