package proctest

import (
	"context"
	"fmt"
	"net"
	"strconv"
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

// FreePort returns a loopback TCP port that is free now. Another process may take it before the
// server binds it; on a test machine that is rare enough.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct free loopback TCP ports. It holds each port until it has all of
// them, so that the system cannot hand out the same one twice.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(Loopback, "0"))
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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
