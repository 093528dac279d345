// Package broker connects quotaflow's processes to NATS: a connection that outlives NATS
// outages, an embedded NATS server with JetStream for development and tests, and a reader that
// tails a stream without changing anything on the server.
package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Client says how a process connects to NATS.
type Client struct {
	// URL may list several servers of a cluster, separated by commas.
	URL string
	// Name is the connection's name, shown by the server's monitoring.
	Name string
	// TLS, when set, is the TLS the servers are reached with (tls:// URLs without it use the
	// system's roots).
	TLS *tls.Config
	// Credentials is a file that authenticates the connection: a NATS credentials file (a
	// user JWT and its seed, decentralized auth) or an nkey seed file (the users of package
	// natsauth). "" means none, or the URL's user info.
	Credentials string
}

// Connect connects for good: it retries a NATS that is down at start and reconnects forever,
// without buffering publishes while disconnected (the publisher's spool keeps them instead).
// A permission the server refuses is logged as an error: it is a deployment's mistake (or an
// attack), never a passing failure.
func Connect(c Client, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("nats refused", "err", err)
		}),
	}
	if c.TLS != nil {
		opts = append(opts, nats.Secure(c.TLS))
	}
	if c.Credentials != "" {
		o, err := CredentialsOption(c.Credentials)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats connect %s: %w", c.URL, err)
	}
	return nc, nil
}

// IsURL reports whether url is one the NATS client dials: nats://, or tls:// for TLS.
func IsURL(url string) bool {
	return strings.HasPrefix(url, "nats://") || strings.HasPrefix(url, "tls://")
}

// CredentialsOption authenticates with the credentials file path: a NATS credentials file (a
// user JWT and its seed) or an nkey seed file. A file that is neither is an error naming it.
func CredentialsOption(path string) (nats.Option, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("nats credentials: %w", err)
	}
	if bytes.Contains(b, []byte("BEGIN NATS USER JWT")) {
		return nats.UserCredentials(path), nil
	}
	o, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return nil, fmt.Errorf("nats credentials %s: neither a NATS credentials file nor an nkey seed: %w", path, err)
	}
	return o, nil
}

// Embedded starts a NATS server with JetStream inside this process, listening on host:port
// with its data in dir, and waits until it accepts connections. Only the users given may
// connect (package natsauth makes them); without users it listens on a loopback address only,
// and refuses any other: a NATS without users is one whose configuration anyone on the
// network can rewrite. Shut it down with Shutdown and WaitForShutdown.
func Embedded(name, listen, dir string, users []*server.NkeyUser) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("listen address: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("listen address: bad port %q", portStr)
	}
	if len(users) == 0 && !loopback(host) {
		return nil, fmt.Errorf("listen address %s: not a loopback address, and the server has no users: anyone who reaches it could rewrite the configuration", listen)
	}
	return EmbeddedWith(&server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		Nkeys:      users,
	})
}

// loopback reports whether host names only this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// EmbeddedWith starts a NATS server inside this process with opts (a cluster member, say) and
// waits until it accepts connections.
func EmbeddedWith(opts *server.Options) (*server.Server, error) {
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats on %s:%d not ready within 10s", opts.Host, opts.Port)
	}
	return srv, nil
}

// Tail reads a stream with an ephemeral ordered consumer, from its newest message on (from its
// oldest with all), restricted to subjects when given, and hands each message to handle until
// handle says it is done or ctx ends. It changes nothing on the server.
func Tail(ctx context.Context, js jetstream.JetStream, stream string, subjects []string, all bool, handle func(jetstream.Msg) (done bool, err error)) error {
	deliver := jetstream.DeliverNewPolicy
	if all {
		deliver = jetstream.DeliverAllPolicy
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: deliver, FilterSubjects: subjects})
	if err != nil {
		return fmt.Errorf("watch %s: %w", stream, err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("fetch: %w", err)
		}
		for msg := range batch.Messages() {
			if done, err := handle(msg); err != nil || done {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			return fmt.Errorf("fetch: %w", err)
		}
	}
	return nil
}
