package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestProgress: the long commands show their progress on one line of a real terminal (a
// pseudo-terminal), rewritten in place and erased before the result, and print none when
// piped. (Bench piped: TestBenchTextAndProgress; backtest shows its replay the same way.)
func TestProgress(t *testing.T) {
	t.Parallel()
	benchTarget := startBenchTarget(t)
	tests := []struct {
		name string
		args func() []string // a new database each call: a migrated one has nothing to show
		want string          // the progress line, after its \r
	}{
		{"migrate", func() []string { return []string{"migrate", "--clickhouse-dsn", chSrv.DSN(databaseName("progress"))} }, "migrate: 1/"},
		{"bench", func() []string {
			return []string{"bench", "--target", benchTarget, "--duration", "1500ms", "--rate", "50"}
		}, "bench     1s "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := tt.args()
			term := startTerminal(t, args...)
			select {
			case <-term.done:
			case <-ctx.Done():
				t.Fatalf("quotaflow %v did not end", args)
			}
			if term.err != nil {
				t.Fatalf("quotaflow %v: %v\n%s", args, term.err, term.output())
			}
			// The line is erased before the result: once it is, the progress was all written.
			out := term.waitOutput(ctx, t, "the progress line erased", func(s string) bool { return strings.Contains(s, "\x1b[K\r\x1b[K") })
			if !strings.Contains(out, "\r"+tt.want) {
				t.Errorf("quotaflow %v on a terminal wrote %q: want a progress line %q drawn in place", args, out, tt.want)
			}
			// Piped, the same command prints its result and no progress.
			args = tt.args()
			stdout, stderr, code := runCmd(ctx, args, nil)
			if code != 0 || stderr != "" || strings.Contains(stdout, "\r") {
				t.Errorf("quotaflow %v piped: exit %d, stderr %q, stdout %q; want 0 and no progress", args, code, stderr, stdout)
			}
		})
	}
}
