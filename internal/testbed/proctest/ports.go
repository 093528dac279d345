package proctest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Loopback is the address the servers listen on: tests need no other, and a server reachable
// from elsewhere would be a hole in the machine running them.
const Loopback = "127.0.0.1"

// dialTimeout bounds one attempt of Listening: a loopback connection is made at once or refused.
const dialTimeout = 100 * time.Millisecond

// Addr is host:port of a loopback port.
func Addr(port int) string {
	return net.JoinHostPort(Loopback, strconv.Itoa(port))
}

// FreePort returns a loopback TCP port that is free now, below the system's ephemeral range
// (see FreePorts).
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct free loopback TCP ports. It holds each port until it has all of
// them, so that the system cannot hand out the same one twice.
//
// The ports are drawn at random below the ephemeral range (ip_local_port_range), never from it:
// a port the system hands out for "port 0" is also one it hands out as the source port of an
// outgoing connection, and a test suite opens thousands of those, so a server started (or
// restarted after a kill) on such a port a moment later could find it taken ("Address already
// in use"). Below the range only another test's draw can collide, and a draw checks the port
// is free.
func FreePorts(n int) ([]int, error) {
	lo, hi := portsBelowEphemeral()
	ports := make([]int, 0, n)
	for attempts := 0; len(ports) < n; attempts++ {
		port := 0 // the system's choice, should the range below the ephemeral one be full
		if attempts < 100*n {
			port = lo + rand.IntN(hi-lo)
		}
		l, err := net.Listen("tcp", Addr(port))
		if err != nil {
			if port == 0 {
				return nil, fmt.Errorf("find a free port: %w", err)
			}
			continue
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portsBelowEphemeral is the range [lo, hi) FreePorts draws from: from 10000 up to the start of
// the system's ephemeral ports (Linux's default 32768 when it cannot be read).
func portsBelowEphemeral() (lo, hi int) {
	lo, hi = 10000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if start, err := strconv.Atoi(f[0]); err == nil && start > lo+1000 {
				hi = start
			}
		}
	}
	return lo, hi
}

// Listening is a Config.Ready for servers that serve once they accept connections on addr.
func Listening(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, dialTimeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}
