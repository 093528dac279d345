package main

import (
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
)

// servingFlags bound what clients of the check port may hold (connections, their time, the size
// of a request) and say what the port shows without credentials (reflection, metrics).
type servingFlags struct {
	maxConns        int
	readTimeout     time.Duration
	idleTimeout     time.Duration
	maxRequestBytes int64
	reflection      string
	metricsListen   string
}

func (s *servingFlags) register(fs *flagSet) {
	fs.IntVar(&s.maxConns, "max-connections", grpcsplit.DefaultMaxConns, "most connections the check port holds open at once; past it new ones wait in the listen backlog, with a warning. Keep it below the file limit (ulimit -n)")
	fs.DurationVar(&s.readTimeout, "read-timeout", grpcsplit.DefaultReadTimeout, "longest a request (headers and body) may take to arrive")
	fs.DurationVar(&s.idleTimeout, "idle-timeout", grpcsplit.DefaultIdleTimeout, "how long a connection may wait for its next request before it is closed (gRPC: GOAWAY)")
	fs.Int64Var(&s.maxRequestBytes, "max-request-bytes", transport.DefaultMaxRequestBytes, "largest request body or message, decompressed, the check port reads; larger ones get ResourceExhausted (HTTP 413 outside RPCs)")
	fs.StringVar(&s.reflection, "reflection", "auto", "gRPC reflection on the check port: on, off, or auto (on without --callers-file, off with it)")
	fs.StringVar(&s.metricsListen, "metrics-listen", "", "`address` serving /metrics on a port of its own instead of the check port (empty: the check port)")
	fs.fromEnv("max-connections", "read-timeout", "idle-timeout", "max-request-bytes", "reflection", "metrics-listen")
}

func (s *servingFlags) validate() error {
	switch {
	case s.maxConns < 1:
		return fmt.Errorf("--max-connections: want at least 1, got %d", s.maxConns)
	case s.readTimeout <= 0:
		return fmt.Errorf("--read-timeout: want more than 0, got %v", s.readTimeout)
	case s.idleTimeout <= 0:
		return fmt.Errorf("--idle-timeout: want more than 0, got %v", s.idleTimeout)
	case s.maxRequestBytes < 64<<10:
		return fmt.Errorf("--max-request-bytes: want at least 65536 (a check at its longest fields), got %d", s.maxRequestBytes)
	case s.reflection != "auto" && s.reflection != "on" && s.reflection != "off":
		return fmt.Errorf("--reflection: want on, off or auto, got %q", s.reflection)
	}
	return nil
}

// apply sets what the flags configure of a checker: gRPC reflection is hidden when asked, or
// by default when callers need credentials (callersFile).
func (s *servingFlags) apply(cfg *daemon.CheckerConfig, callersFile string) {
	cfg.Transport.HideReflection = s.reflection == "off" || s.reflection == "auto" && callersFile != ""
	cfg.Transport.MaxRequestBytes, cfg.MetricsListen = s.maxRequestBytes, s.metricsListen
	cfg.Transport.Conns = grpcsplit.Config{MaxConns: s.maxConns, ReadTimeout: s.readTimeout, IdleTimeout: s.idleTimeout}
}
