package daemon

import (
	"errors"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	"github.com/quotaflow/quotaflow/publisher"
)

// TestValidateNamesFields: Validate's errors name the field at fault as a path from the
// config, so that a command can name its flag.
func TestValidateNamesFields(t *testing.T) {
	t.Parallel()
	good := func() CheckerConfig {
		return CheckerConfig{RulesFile: "rules.yaml", SharedHashes: 1,
			Publisher: publisher.Config{Partitions: 16, Replicas: 1, MaxAge: time.Hour, DuplicateWindow: time.Minute,
				MaxBatch: 1, FlushInterval: time.Millisecond, SpoolMaxBytes: 1 << 20, SpoolDir: "spool"}}
	}
	for _, tt := range []struct {
		field  string
		change func(*CheckerConfig)
	}{
		{"", func(*CheckerConfig) {}},
		{"RulesFile", func(c *CheckerConfig) { c.RulesFile = "" }},
		{"InstanceID", func(c *CheckerConfig) { c.InstanceID = "a.b" }},
		{"InstanceID", func(c *CheckerConfig) { c.InstanceID = "a|b" }},
		{"JournalGrace", func(c *CheckerConfig) { c.JournalGrace = time.Millisecond }},
		{"Publisher.Partitions", func(c *CheckerConfig) { c.Publisher.Partitions = 0 }},
		{"Publisher.DuplicateWindow", func(c *CheckerConfig) { c.Publisher.DuplicateWindow = 2 * time.Hour }},
		{"Transport.Conns.MaxConns", func(c *CheckerConfig) { c.Transport.Conns.MaxConns = 0 }},
		{"Health.Interval", func(c *CheckerConfig) { c.Health.Interval = time.Millisecond }},
	} {
		c := good()
		c.Tracing.SampleRatio = 0.5
		c.Admin.ReadPerMinute, c.Admin.WritePerMinute, c.Admin.AuthFailuresPerMinute = 1, 1, 1
		c.Transport.Conns = grpcsplit.Config{MaxConns: 1, ReadTimeout: time.Second, IdleTimeout: time.Second}
		c.Transport.MaxRequestBytes, c.Health.Interval, c.JournalGrace = 64<<10, time.Second, time.Minute
		tt.change(&c)
		err := c.Validate()
		var fe *field.Error
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("a valid config: %v", err)
		case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
			t.Errorf("want an error about %s, got %v", tt.field, err)
		}
	}
	if err := (&CheckerConfig{}).Validate(); !errors.Is(err, ErrRulesRequired) {
		t.Errorf("no rules and no NATS: %v, want ErrRulesRequired", err)
	}
}
