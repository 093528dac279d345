// Package broker connects quotaflow's processes to NATS: a connection that outlives NATS
// outages, an embedded NATS server with JetStream for development and tests, and a reader that
// tails a stream without changing anything on the server.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Connect connects for good: it retries a NATS that is down at start and reconnects forever,
// without buffering publishes while disconnected (the publisher's spool keeps them instead).
// url may list several servers of a cluster, separated by commas. tlsConfig, when set, is the
// TLS the servers are reached with (tls:// URLs without it use the system's roots).
func Connect(url, name string, tlsConfig *tls.Config, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
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
	}
	if tlsConfig != nil {
		opts = append(opts, nats.Secure(tlsConfig))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats connect %s: %w", url, err)
	}
	return nc, nil
}

// Embedded starts a NATS server with JetStream inside this process, listening on host:port
// with its data in dir, and waits until it accepts connections. Shut it down with Shutdown and
// WaitForShutdown.
func Embedded(name, listen, dir string) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("listen address: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("listen address: bad port %q", portStr)
	}
	return EmbeddedWith(&server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
	})
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
