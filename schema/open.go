package schema

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// DSNError is a DSN that is not a clickhouse:// URL clickhouse-go can read.
type DSNError struct{ Err error }

// Error implements error.
func (e *DSNError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *DSNError) Unwrap() error { return e.Err }

// ParseDSN checks a native-protocol DSN, clickhouse://user:password@host:9000/database, and
// returns its options; its errors are *DSNError.
func ParseDSN(dsn string) (*clickhouse.Options, error) {
	if !strings.HasPrefix(dsn, "clickhouse://") {
		return nil, &DSNError{fmt.Errorf("want a clickhouse:// URL (native protocol), got %q", dsn)}
	}
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return nil, &DSNError{err}
	}
	return opts, nil
}

// Open connects to the server a DSN names, not to its database (which Migrate may still have
// to create), and returns the database: the DSN's, else DefaultDatabase. Dialing gives up after
// 5s (or the DSN's dial_timeout when shorter). tlsConfig, when set, is the TLS the server is
// reached with (a DSN with secure=true without it uses the system's roots).
func Open(dsn string, tlsConfig *tls.Config) (driver.Conn, string, error) {
	opts, err := ParseDSN(dsn)
	if err != nil {
		return nil, "", err
	}
	if tlsConfig != nil {
		opts.TLS = tlsConfig
	}
	db := opts.Auth.Database
	if db == "" {
		db = DefaultDatabase
	}
	opts.Auth.Database = ""
	if opts.DialTimeout == 0 || opts.DialTimeout > 5*time.Second {
		opts.DialTimeout = 5 * time.Second
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, "", fmt.Errorf("clickhouse: %w", err)
	}
	return conn, db, nil
}

// RedactDSN hides a DSN's password, for logs.
func RedactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "clickhouse://?"
	}
	return u.Redacted()
}
