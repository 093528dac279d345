package dashboard

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/broker"
)

// connect opens a connection named name to url ("" means nats.DefaultURL), authenticated by
// the credentials file creds ("" none; the operator role's suffices: the views only read), and
// its JetStream.
func connect(url, name, creds string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	if url == "" {
		url = nats.DefaultURL
	}
	opts = append(opts, nats.Name(name))
	if creds != "" {
		o, err := broker.CredentialsOption(creds)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("nats connect %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
