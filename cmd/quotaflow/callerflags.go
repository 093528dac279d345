package main

import (
	"fmt"

	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/transport"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// callerFlags configure who may call the check API and what forward-auth believes, in the
// checker's config: its callers file and forward-auth settings.
type callerFlags struct {
	trustedProxies []string
	dimensions     []string
	cfg            *daemon.CheckerConfig
}

func (c *callerFlags) register(fs *cli.FlagSet, cfg *daemon.CheckerConfig) {
	c.cfg = cfg
	fa := &cfg.Transport.ForwardAuth
	fs.StringVar(&cfg.CallersFile, "callers-file", "", "YAML `file` of the check API's callers and their permissions (check, assert-tier, reset, admin), reloaded when it changes; without it anyone may check, nobody may assert a tier, and reset needs an admin write token")
	fs.ListVar(&c.trustedProxies, "trusted-proxies", "comma-separated `CIDRs` of the proxies whose X-Forwarded-For, X-Real-Ip and X-Client-Ip forward-auth believes; without any, the client IP is the connection's address")
	fs.StringVar(&fa.UserHeader, "forward-auth-user-header", "X-User-Id", "forward-auth `header` naming the user")
	fs.StringVar(&fa.APIKeyHeader, "forward-auth-api-key-header", "X-Api-Key", "forward-auth `header` naming the API key")
	fs.StringVar(&fa.EndpointHeader, "forward-auth-endpoint-header", "", "forward-auth `header` naming the endpoint (default X-Forwarded-Uri, then X-Original-URI, then ?endpoint=)")
	fs.StringVar(&fa.IdempotencyHeader, "forward-auth-idempotency-header", "", "forward-auth `header` carrying an idempotency key, set by the gateway and stripped from clients (default: none, idempotency off)")
	fs.ListVar(&c.dimensions, "forward-auth-dimension-headers", "forward-auth custom dimensions, comma-separated `name=header` pairs (tenant=X-Tenant-Id): a header present is that dimension's value; set by the gateway and stripped from clients")
	fs.IntVar(&fa.MaxWaiting, "max-waiting", transport.DefaultMaxWaiting, "most delayed forward-auth requests held at once by ?wait=true (on_limit: delay); past it a delayed request is answered at once with its wait in X-Quotaflow-Delay-Ms (still charged at its slot); negative: none held")
	fs.FromEnv("callers-file", "trusted-proxies", "forward-auth-user-header", "forward-auth-api-key-header",
		"forward-auth-endpoint-header", "forward-auth-idempotency-header", "forward-auth-dimension-headers", "max-waiting")
}

// validate parses the proxies and the dimension headers, and loads the callers file.
func (c *callerFlags) validate() error {
	fa, file := &c.cfg.Transport.ForwardAuth, c.cfg.CallersFile
	var err error
	if fa.TrustedProxies, err = transport.ParseTrustedProxies(c.trustedProxies); err != nil {
		return cli.FlagError(err, nil)
	}
	fa.DimensionHeaders, err = transport.ParseDimensionHeaders(c.dimensions)
	if err != nil {
		return cli.FlagError(err, map[string]string{"DimensionHeaders": "forward-auth-dimension-headers"})
	}
	c.cfg.Transport.Callers = new(auth.Registry)
	if file != "" {
		if err := c.cfg.Transport.Callers.LoadFile(file); err != nil {
			return fmt.Errorf("--callers-file: %w", err)
		}
	}
	return nil
}
