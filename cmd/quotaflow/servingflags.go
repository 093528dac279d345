package main

import (
	"fmt"

	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
)

// servingFlags bound what clients of the check port may hold (connections, their time, the size
// of a request) and say what the port shows without credentials (reflection, metrics).
type servingFlags struct {
	reflection string
}

func (s *servingFlags) register(fs *cli.FlagSet, cfg *daemon.CheckerConfig) {
	conns := &cfg.Transport.Conns
	fs.IntVar(&conns.MaxConns, "max-connections", grpcsplit.DefaultMaxConns, "most connections the check port holds open at once; past it new ones wait in the listen backlog, with a warning. Keep it below the file limit (ulimit -n)")
	fs.DurationVar(&conns.ReadTimeout, "read-timeout", grpcsplit.DefaultReadTimeout, "longest a request (headers and body) may take to arrive")
	fs.DurationVar(&conns.IdleTimeout, "idle-timeout", grpcsplit.DefaultIdleTimeout, "how long a connection may wait for its next request before it is closed (gRPC: GOAWAY)")
	fs.Int64Var(&cfg.Transport.MaxRequestBytes, "max-request-bytes", transport.DefaultMaxRequestBytes, "largest request body or message, decompressed, the check port reads; larger ones get ResourceExhausted (HTTP 413 outside RPCs)")
	fs.StringVar(&s.reflection, "reflection", "auto", "gRPC reflection on the check port: on, off, or auto (on without --callers-file, off with it)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "", "`address` serving /metrics on a port of its own instead of the check port (empty: the check port)")
	fs.FromEnv("max-connections", "read-timeout", "idle-timeout", "max-request-bytes", "reflection", "metrics-listen")
}

// validate checks --reflection, which becomes daemon.CheckerConfig's HideReflection once the
// callers file is known: gRPC reflection is hidden when asked, or by default when callers
// need credentials.
func (s *servingFlags) validate() error {
	if s.reflection != "auto" && s.reflection != "on" && s.reflection != "off" {
		return fmt.Errorf("--reflection: want on, off or auto, got %q", s.reflection)
	}
	return nil
}
