package daemon

import (
	"errors"
	"os"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/schema"
)

// ErrRulesRequired is the cause of CheckerConfig.Validate's error when neither RulesFile nor
// NATSURL names where the rules come from.
var ErrRulesRequired = errors.New("required without NATSURL (with it, the rule store is the source)")

// Validate reports the first field of c out of its range, as a *field.Error naming it as a
// path from c (Publisher.Partitions); a message naming another field names it so too. Unlike
// StartChecker, it reads a zero field as given rather than as its default: it is for callers
// that set every field, such as a command line, where a zero is a mistake and not "the
// default". It reads no file but the credentials', whose errors would otherwise come from a
// connection retried in the background.
func (c *CheckerConfig) Validate() error {
	switch {
	case c.RulesFile == "" && c.NATSURL == "":
		return &field.Error{Field: "RulesFile", Msg: ErrRulesRequired.Error(), Err: ErrRulesRequired}
	case strings.ContainsAny(c.InstanceID, " .*>|\t\r\n") || len(c.InstanceID) > 64:
		// '|' separates the fields of a balance journal's entry, which names a decision id.
		return field.Errorf("InstanceID", "at most 64 characters, without spaces, '.', '*', '>' or '|', got %q", c.InstanceID)
	case c.JournalGrace < time.Second:
		return field.Errorf("JournalGrace", "want at least 1s, got %s", c.JournalGrace)
	case c.Tracing.SampleRatio <= 0 || c.Tracing.SampleRatio > 1:
		return field.Errorf("Tracing.SampleRatio", "want more than 0 and at most 1, got %v", c.Tracing.SampleRatio)
	case c.SharedHashes < 1 || c.SharedHashes > 1<<16:
		return field.Errorf("SharedHashes", "want 1 to 65536 hashes per cluster slot, got %d", c.SharedHashes)
	case c.NATSURL != "" && !broker.IsURL(c.NATSURL):
		return field.Errorf("NATSURL", "want a nats:// or tls:// URL, got %q", c.NATSURL)
	}
	if err := within("Publisher", c.Publisher.Validate()); err != nil {
		return err
	}
	if c.Publisher.SpoolDir == "" {
		return field.Errorf("Publisher.SpoolDir", "required with NATSURL")
	}
	if err := credentials("NATSCredentials", c.NATSCredentials); err != nil {
		return err
	}
	if err := credentials("NATSAdminCredentials", c.NATSAdminCredentials); err != nil {
		return err
	}
	return c.validateServing()
}

// validateServing checks what bounds the ports: the admin API's rates, the check port's
// connections and requests, the audit's DSN and the health reports.
func (c *CheckerConfig) validateServing() error {
	conns := &c.Transport.Conns
	for _, r := range []struct {
		name string
		n    int
	}{{"ReadPerMinute", c.Admin.ReadPerMinute}, {"WritePerMinute", c.Admin.WritePerMinute}, {"AuthFailuresPerMinute", c.Admin.AuthFailuresPerMinute}} {
		if r.n < 1 {
			return field.Errorf("Admin."+r.name, "want at least 1, got %d", r.n)
		}
	}
	if c.AuditClickHouseDSN != "" {
		if _, err := schema.ParseDSN(c.AuditClickHouseDSN); err != nil {
			return &field.Error{Field: "AuditClickHouseDSN", Msg: err.Error(), Err: err}
		}
	}
	switch {
	case conns.MaxConns < 1:
		return field.Errorf("Transport.Conns.MaxConns", "want at least 1, got %d", conns.MaxConns)
	case conns.ReadTimeout <= 0:
		return field.Errorf("Transport.Conns.ReadTimeout", "want more than 0, got %v", conns.ReadTimeout)
	case conns.IdleTimeout <= 0:
		return field.Errorf("Transport.Conns.IdleTimeout", "want more than 0, got %v", conns.IdleTimeout)
	case c.Transport.MaxRequestBytes < 64<<10:
		return field.Errorf("Transport.MaxRequestBytes", "want at least 65536 (a check at its longest fields), got %d", c.Transport.MaxRequestBytes)
	}
	return within("Health", c.Health.Validate())
}

// Validate reports the first field of c out of its range, as CheckerConfig.Validate does:
// a zero field is read as given, not as its default.
func (c *AggregatorConfig) Validate() error {
	g := &c.Aggregator
	switch {
	case !broker.IsURL(c.NATSURL):
		return field.Errorf("NATSURL", "want a nats:// or tls:// URL, got %q", c.NATSURL)
	case g.Partitions < 1 || g.Partitions > stream.MaxPartitions:
		return field.Errorf("Aggregator.Partitions", "want 1 to %d, got %d", stream.MaxPartitions, g.Partitions)
	case g.Replicas < 1 || g.Replicas > 5:
		return field.Errorf("Aggregator.Replicas", "want 1 to 5, got %d", g.Replicas)
	case g.BatchRows < 1:
		return field.Errorf("Aggregator.BatchRows", "want at least 1, got %d", g.BatchRows)
	case g.FlushInterval < time.Millisecond:
		return field.Errorf("Aggregator.FlushInterval", "want at least 1ms, got %s", g.FlushInterval)
	case g.InsertTimeout < 100*time.Millisecond:
		return field.Errorf("Aggregator.InsertTimeout", "want at least 100ms, got %s", g.InsertTimeout)
	case g.PinnedTTL <= g.InsertTimeout:
		return field.Errorf("Aggregator.PinnedTTL", "want more than InsertTimeout (%s), got %s", g.InsertTimeout, g.PinnedTTL)
	case g.AckWait <= g.FlushInterval+g.InsertTimeout:
		return field.Errorf("Aggregator.AckWait", "want more than FlushInterval plus InsertTimeout (%s), got %s", g.FlushInterval+g.InsertTimeout, g.AckWait)
	case g.RetentionInterval < time.Second:
		return field.Errorf("Aggregator.RetentionInterval", "want at least 1s, got %s", g.RetentionInterval)
	case g.PolicyInterval < 10*time.Millisecond || g.PolicyInterval > time.Hour:
		return field.Errorf("Aggregator.PolicyInterval", "want 10ms to 1h, got %s", g.PolicyInterval)
	case g.WarningGrace < 0 || g.WarningGrace > time.Minute:
		return field.Errorf("Aggregator.WarningGrace", "want 0 to 1m, got %s", g.WarningGrace)
	case !validInstance(g.InstanceID):
		return field.Errorf("Aggregator.InstanceID", "at most 64 letters, digits, '-' or '_', got %q", g.InstanceID)
	}
	if _, err := schema.ParseDSN(c.ClickHouseDSN); err != nil {
		return &field.Error{Field: "ClickHouseDSN", Msg: err.Error(), Err: err}
	}
	if err := credentials("NATSCredentials", c.NATSCredentials); err != nil {
		return err
	}
	return within("Health", c.Health.Validate())
}

// ReadIDKeys reads the file of the keys that sign reservation and lease ids
// (CheckerConfig.IDKeys): one key per line, blank lines and # comments skipped, each at
// least 32 characters. Its errors are *field.Errors about IDKeys. An empty path is no keys.
func ReadIDKeys(path string) ([][]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &field.Error{Field: "IDKeys", Msg: err.Error(), Err: err}
	}
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < 32 {
			return nil, field.Errorf("IDKeys", "%s:%d: a key of %d characters, want at least 32 (openssl rand -hex 32)", path, i+1, len(line))
		}
		keys = append(keys, []byte(line))
	}
	if len(keys) == 0 {
		return nil, field.Errorf("IDKeys", "%s holds no key", path)
	}
	return keys, nil
}

// validInstance reports whether s may name an aggregator among its peers: it is part of the
// names of its NATS keys.
func validInstance(s string) bool {
	if len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// credentials refuses a credentials file that cannot be read or is not one, at once rather
// than in a connection retried in the background.
func credentials(name, path string) error {
	if path == "" {
		return nil
	}
	if _, err := broker.CredentialsOption(path); err != nil {
		return &field.Error{Field: name, Msg: err.Error(), Err: err}
	}
	return nil
}

// within makes err, a *field.Error of the Config in field parent, name its field from the
// outer Config (Publisher.Partitions). Other errors are returned as they are.
func within(parent string, err error) error {
	var fe *field.Error
	if !errors.As(err, &fe) {
		return err
	}
	return &field.Error{Field: parent + "." + fe.Field, Msg: fe.Msg, Err: fe.Err}
}
