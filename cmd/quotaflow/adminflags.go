package main

import (
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// adminFlags configure the admin REST API of the commands that run a checker.
type adminFlags struct {
	token      string
	tokensFile string
}

func (a *adminFlags) register(fs *cli.FlagSet, cfg *daemon.CheckerConfig) {
	fs.StringVar(&a.token, "admin-token", "", "bearer `token` with write access to the admin API under /api/v1 (name \"admin\"); without any token the API refuses every call")
	fs.StringVar(&a.tokensFile, "admin-tokens-file", "", "YAML `file` of admin API tokens: tokens: [{token: ..., name: ..., role: read|write}]")
	fs.IntVar(&cfg.Admin.ReadPerMinute, "admin-read-per-minute", 1000, "admin API reads allowed per token per minute")
	fs.IntVar(&cfg.Admin.WritePerMinute, "admin-write-per-minute", 100, "admin API writes allowed per token per minute")
	fs.IntVar(&cfg.Admin.AuthFailuresPerMinute, "admin-auth-failures-per-minute", 10, "failed authentications allowed per source address per minute, counted alike by the admin API and every protocol of the check API; past it the address's credentials are refused (429, ResourceExhausted) until its bucket refills")
	fs.StringVar(&cfg.AuditClickHouseDSN, "audit-clickhouse-dsn", "", "ClickHouse native-protocol `DSN` whose decision audit and usage rollups the admin API reads for backtests (POST /api/v1/rules:backtest) and the console's usage and subject views; empty: they answer 503 (quotaflow serve with an aggregator uses its --clickhouse-dsn)")
	fs.StringVar(&cfg.AuditClickHouseDSN, "backtest-clickhouse-dsn", "", "the old name of --audit-clickhouse-dsn")
	fs.FromEnv("admin-token", "admin-tokens-file", "admin-read-per-minute", "admin-write-per-minute", "admin-auth-failures-per-minute", "audit-clickhouse-dsn")
	registerWebhookPolicy(fs, &cfg.Admin.WebhookPolicy)
}

// registerWebhookPolicy adds the flags of where webhook endpoints may point: the admin API
// checks an endpoint set against them, the aggregator every connection it makes.
func registerWebhookPolicy(fs *cli.FlagSet, p *webhook.URLPolicy) {
	fs.ListVar(&p.AllowHosts, "webhook-allow-hosts", "comma-separated `hosts` (or host:port) webhook endpoints may reach whatever they resolve to, loopback and private included; other endpoints reach public addresses only")
	fs.BoolVar(&p.AllowPrivate, "webhook-allow-private", false, "let webhook endpoints reach private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7); loopback and link-local stay refused")
	fs.FromEnv("webhook-allow-hosts", "webhook-allow-private")
}
