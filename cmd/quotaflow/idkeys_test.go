package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// TestReadIDKeys: --id-keys-file gives its keys in order, skipping blanks and comments, and a
// short key or an empty file is an error naming the flag (and the line).
func TestReadIDKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	long1, long2 := strings.Repeat("a", 32), strings.Repeat("b", 64)
	tests := []struct {
		name, content string
		want          []string
		err           string
	}{
		{"rotation", "# new first\n" + long2 + "\n\n" + long1 + "\n", []string{long2, long1}, ""},
		{"short", long1 + "\nshort\n", nil, "--id-keys-file: " + filepath.Join(dir, "short") + ":2: a key of 5 characters"},
		{"empty", "# none\n", nil, "holds no key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, tt.name)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			keys, err := readIDKeys(path)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("readIDKeys = %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil || len(keys) != len(tt.want) {
				t.Fatalf("readIDKeys = %q, %v; want %q", keys, err, tt.want)
			}
			for i := range keys {
				if string(keys[i]) != tt.want[i] {
					t.Errorf("key %d = %q, want %q", i, keys[i], tt.want[i])
				}
			}
		})
	}
	if _, err := readIDKeys(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--id-keys-file") {
		t.Errorf("a missing file: %v, want an error naming the flag", err)
	}
}

// readIDKeys reads --id-keys-file as the checker command does.
func readIDKeys(path string) ([][]byte, error) {
	keys, err := daemon.ReadIDKeys(path)
	return keys, cli.FlagError(err, checkerFlagNames)
}
