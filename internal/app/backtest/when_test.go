package backtest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// TestSpecRequest: a Spec becomes the Request it spells, and each bad field is a *field.Error
// naming it as the flags do.
func TestSpecRequest(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte("rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name               string
		spec               Spec
		wantField, wantMsg string
		wantFrom, wantTo   time.Time
	}{
		{"defaults", Spec{RulesFile: file}, "", "", now.Add(-time.Hour), now},
		{"durations", Spec{RulesFile: file, From: "3h", To: "1h"}, "", "", now.Add(-3 * time.Hour), now.Add(-time.Hour)},
		{"live: whole history", Spec{Live: true}, "", "", time.Time{}, now},
		{"no rules", Spec{}, "rules", "required", time.Time{}, time.Time{}},
		{"missing rules file", Spec{RulesFile: file + ".gone"}, "rules", "no such file", time.Time{}, time.Time{}},
		{"live with a warm-up", Spec{Live: true, Warmup: time.Minute}, "warmup", "replays nothing", time.Time{}, time.Time{}},
		{"bad from", Spec{RulesFile: file, From: "yesterday"}, "from", "neither an RFC 3339 time", time.Time{}, time.Time{}},
		{"bad to", Spec{RulesFile: file, To: "-1h"}, "to", "cannot be negative", time.Time{}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := tt.spec.Request(now)
			if tt.wantField != "" {
				var fe *field.Error
				if !errors.As(err, &fe) || fe.Field != tt.wantField || !strings.Contains(fe.Msg, tt.wantMsg) {
					t.Fatalf("Request = %v, want a *field.Error of %s saying %q", err, tt.wantField, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !req.From.Equal(tt.wantFrom) || !req.To.Equal(tt.wantTo) || (req.Rules == nil) != tt.spec.Live {
				t.Errorf("Request = from %v to %v (rules %v), want from %v to %v", req.From, req.To, req.Rules != nil, tt.wantFrom, tt.wantTo)
			}
		})
	}
}
