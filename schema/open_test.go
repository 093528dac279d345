package schema

import (
	"errors"
	"strings"
	"testing"
)

func TestParseDSN(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dsn, wantErr string
	}{
		{"clickhouse://default:secret@127.0.0.1:9000/quotaflow", ""},
		{"http://127.0.0.1:8123", "want a clickhouse:// URL"},
		{"clickhouse://127.0.0.1:9000/db?dial_timeout=abc", "dial timeout"},
	}
	for _, tt := range tests {
		_, err := ParseDSN(tt.dsn)
		var de *DSNError
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ParseDSN(%q) = %v, want nil", tt.dsn, err)
		case tt.wantErr != "" && (!errors.As(err, &de) || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("ParseDSN(%q) = %v, want a *DSNError with %q", tt.dsn, err, tt.wantErr)
		}
	}
	if got := RedactDSN("clickhouse://default:secret@127.0.0.1:9000/quotaflow"); strings.Contains(got, "secret") {
		t.Errorf("RedactDSN kept the password: %q", got)
	}
}
