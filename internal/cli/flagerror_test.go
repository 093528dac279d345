package cli

import (
	"testing"

	"github.com/quotaflow/quotaflow/internal/field"
)

// TestFlagError: a Config field's error names the field's flag, in kebab case or as the
// table spells it, and so do the sibling fields its message names; other errors pass as
// they are.
func TestFlagError(t *testing.T) {
	t.Parallel()
	flags := map[string]string{"Aggregator.InsertTimeout": "insert-timeout", "NATSURL": "nats-url", "Publisher.MaxAge": "stream-max-age"}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{field.Errorf("Rate", "want more than 0"), "--rate: want more than 0"},
		{field.Errorf("InstanceID", "too long"), "--instance-id: too long"},
		{field.Errorf("Aggregator.PinnedTTL", "want more than InsertTimeout (5s)"), "--pinned-ttl: want more than --insert-timeout (5s)"},
		{field.Errorf("Publisher.SpoolDir", "required with NATSURL"), "--spool-dir: required with --nats-url"},
		{field.Errorf("NATSURL", "want nats://"), "--nats-url: want nats://"},
		{field.Errorf("NATSURL", "want a NATSURL, not a Redis one"), "--nats-url: want a NATSURL, not a Redis one"}, // its own name is the value's
		{field.Errorf("Publisher.DuplicateWindow", "at most MaxAge"), "--duplicate-window: at most --stream-max-age"},
	} {
		if got := FlagError(tt.err, flags); got.Error() != tt.want {
			t.Errorf("FlagError(%v) = %q, want %q", tt.err, got, tt.want)
		}
		if _, ok := FlagError(tt.err, flags).(UsageError); !ok {
			t.Errorf("FlagError(%v) is not a usage error", tt.err)
		}
	}
	if FlagError(nil, flags) != nil {
		t.Error("FlagError(nil) != nil")
	}
}
