package daemon

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/field"
)

// EmbeddedNATSConfig configures the NATS server that quotaflow serve runs in its own process
// for development. The zero value is usable: 127.0.0.1:4222, data in .dev/nats.
type EmbeddedNATSConfig struct {
	// Listen is the client port's address; Dir the JetStream data's folder, created if missing.
	Listen, Dir string
	// CredentialsDir holds the seed of each role (natsauth), written on the first start, and
	// the server admits their users only; "" means Dir/auth.
	CredentialsDir string
	// Partitions of the decision stream, the aggregators' consumers (natsauth.Config).
	Partitions int
	// Logger is told where the server listens and where the operator's seed is.
	Logger *slog.Logger
}

// StartEmbeddedNATS starts the server cfg configures, with JetStream. An error of the folders
// or the address is a *field.Error naming the field at fault.
func StartEmbeddedNATS(cfg EmbeddedNATSConfig) (*server.Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:4222"
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(".dev", "nats")
	}
	if cfg.CredentialsDir == "" {
		cfg.CredentialsDir = filepath.Join(cfg.Dir, "auth")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, &field.Error{Field: "Dir", Msg: err.Error(), Err: err}
	}
	keys, err := natsauth.Ensure(cfg.CredentialsDir)
	if err != nil {
		return nil, &field.Error{Field: "CredentialsDir", Msg: err.Error(), Err: err}
	}
	users, err := natsauth.Config{Partitions: cfg.Partitions}.Users(keys)
	if err != nil {
		return nil, err
	}
	ns, err := broker.Embedded("quotaflow-dev", cfg.Listen, cfg.Dir, users)
	if err != nil {
		return nil, &field.Error{Field: "Listen", Msg: err.Error(), Err: err}
	}
	cfg.Logger.Info("embedded NATS listening", "url", ns.ClientURL(), "jetstream_dir", cfg.Dir,
		"operator_credentials", natsauth.SeedFile(cfg.CredentialsDir, natsauth.Operator))
	return ns, nil
}
