package main

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/tlsfiles"
)

// serverTLSFlags are the check port's TLS files.
type serverTLSFlags struct {
	cert, key, clientCA string
}

func (f *serverTLSFlags) register(fs *cli.FlagSet) {
	fs.StringVar(&f.cert, "tls-cert", "", "PEM `file` of the certificate the check and admin port serves TLS with (reloaded when it changes); without it the port is cleartext")
	fs.StringVar(&f.key, "tls-key", "", "PEM `file` of the key of --tls-cert")
	fs.StringVar(&f.clientCA, "tls-client-ca", "", "PEM `file` of the CAs whose client certificates the port requires (callers named by certificate: --callers-file)")
	fs.FromEnv("tls-cert", "tls-key", "tls-client-ca")
}

// config returns the listener's TLS configuration, nil for cleartext.
func (f *serverTLSFlags) config() (*tls.Config, error) {
	switch {
	case f.cert == "" && f.key == "" && f.clientCA == "":
		return nil, nil
	case f.cert == "" || f.key == "":
		return nil, errors.New("--tls-cert and --tls-key: want both")
	}
	cfg, err := tlsfiles.Server(f.cert, f.key, f.clientCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	return cfg, nil
}

// clientTLSFlags are the TLS files of the connections to one engine (redis, nats, clickhouse).
type clientTLSFlags struct {
	engine        string
	ca, cert, key string
}

func (f *clientTLSFlags) register(fs *cli.FlagSet, engine, what string) {
	f.engine = engine
	fs.StringVar(&f.ca, engine+"-ca-file", "", "PEM `file` of the CAs that sign "+what+"'s certificate (default: the system's)")
	fs.StringVar(&f.cert, engine+"-cert-file", "", "PEM `file` of the client certificate presented to "+what)
	fs.StringVar(&f.key, engine+"-key-file", "", "PEM `file` of the key of --"+engine+"-cert-file")
	fs.FromEnv(engine+"-ca-file", engine+"-cert-file", engine+"-key-file")
}

func (f *clientTLSFlags) set() bool { return f.ca != "" || f.cert != "" || f.key != "" }

// config returns the client TLS configuration for a server named serverName, nil when no file
// is named.
func (f *clientTLSFlags) config(serverName string) (*tls.Config, error) {
	if !f.set() {
		return nil, nil
	}
	cfg, err := tlsfiles.Client(f.ca, f.cert, f.key, serverName)
	if err != nil {
		return nil, fmt.Errorf("--%s-ca-file, --%s-cert-file, --%s-key-file: %w", f.engine, f.engine, f.engine, err)
	}
	return cfg, nil
}
