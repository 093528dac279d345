package loadgen

import (
	"errors"
	"testing"
)

// TestValidate: Validate reads zero fields as given, not as Run's defaults, and names the
// field at fault; a batch of a protocol without batches is ErrBatchProtocol.
func TestValidate(t *testing.T) {
	t.Parallel()
	full := Config{}.withDefaults()
	full.Batch = 1
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // "" for valid
	}{
		{"every field set", func(*Config) {}, ""},
		{"zero concurrency", func(c *Config) { c.Concurrency = 0 }, "Concurrency"},
		{"zero batch", func(c *Config) { c.Batch = 0 }, "Batch"},
		{"empty endpoint", func(c *Config) { c.Endpoint = "" }, "Endpoint"},
		{"empty target", func(c *Config) { c.Target = "" }, "Target"},
		{"batch of rls", func(c *Config) { c.Batch, c.Protocol = 8, ProtocolRLS }, "Batch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := full
			tt.edit(&c)
			err := c.Validate()
			var ce *ConfigError
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.field != "" && (!errors.As(err, &ce) || ce.Field != tt.field):
				t.Errorf("Validate() = %v, want a *ConfigError for %s", err, tt.field)
			}
		})
	}
	c := full
	c.Batch, c.Protocol = 8, ProtocolRLS
	if err := c.Validate(); !errors.Is(err, ErrBatchProtocol) {
		t.Errorf("Validate() of batches over RLS = %v, want ErrBatchProtocol", err)
	}
}
