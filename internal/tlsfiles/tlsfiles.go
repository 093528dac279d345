// Package tlsfiles builds TLS configurations from PEM files: a server's, whose certificate is
// reloaded when its files change (a rotated certificate needs no restart), and a client's, for
// the connections to Redis, NATS and ClickHouse.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Server returns the configuration of a TLS listener serving the key pair in certFile and
// keyFile, read again when either file's modification time changes (checked at most once a
// second, at handshakes). With caFile, clients must present a certificate signed by one of its
// CAs. HTTP/2 and HTTP/1.1 are offered by ALPN.
func Server(certFile, keyFile, caFile string) (*tls.Config, error) {
	kp := &keyPair{cert: certFile, key: keyFile}
	if err := kp.load(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() },
	}
	if caFile != "" {
		pool, err := pool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client returns the configuration of a TLS client: caFile's CAs as the roots (the system's
// when empty), and the key pair in certFile and keyFile as its certificate when they are set.
// serverName, when set, is the name the server's certificate must carry.
func Client(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pool, err := pool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	case certFile != "" || keyFile != "":
		return nil, errors.New("client certificate: want both the certificate and the key file")
	}
	return cfg, nil
}

func pool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("ca file: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("ca file %s: no PEM certificate in it", caFile)
	}
	return p, nil
}

// keyPair is a certificate and key read from files, read again when they change.
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	current   *tls.Certificate
	mod       [2]time.Time // of cert and key when current was read
	checked   time.Time
}

func (k *keyPair) load() error {
	mod, err := k.modTimes()
	if err != nil {
		return err
	}
	c, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		return fmt.Errorf("tls certificate: %w", err)
	}
	k.current, k.mod = &c, mod
	return nil
}

func (k *keyPair) modTimes() ([2]time.Time, error) {
	var mod [2]time.Time
	for i, f := range []string{k.cert, k.key} {
		st, err := os.Stat(f)
		if err != nil {
			return mod, fmt.Errorf("tls certificate: %w", err)
		}
		mod[i] = st.ModTime()
	}
	return mod, nil
}

// get returns the key pair, read again when its files changed. A pair that fails to load (a
// rotation half done) leaves the current one in use until the next check.
func (k *keyPair) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now := time.Now(); now.Sub(k.checked) >= time.Second {
		k.checked = now
		if mod, err := k.modTimes(); err == nil && mod != k.mod {
			_ = k.load()
		}
	}
	return k.current, nil
}
