package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// quotaflow override: limits changed for a while, through a checker's admin API.

var overrideGroup = cli.Group{Name: "override", Usage: help("override"), Verbs: map[string]cli.Func{
	"set": overrideSet, "list": overrideList,
	"delete": deleteVerb("override", "override", "an override id", "Removes an override (argument: its id) before its expiry.", (*admin.Client).DeleteOverride),
}}

func overrideSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("override set", help("override-set"), stderr)
	c := registerAdminClient(fs)
	var (
		user, ip, apiKey, tier, rule, reason, id string
		limit                                    int64
		mult                                     float64
		duration                                 time.Duration
	)
	fs.StringVar(&user, "user", "", "user id to override")
	fs.StringVar(&ip, "ip", "", "client IP to override")
	fs.StringVar(&apiKey, "api-key", "", "API key to override")
	fs.StringVar(&apiKey, "apikey", "", "same as --api-key")
	fs.StringVar(&tier, "tier", "", "tier to override")
	fs.StringVar(&rule, "rule", "", "rule `id` the override applies to (default: every rule of the target)")
	fs.Int64Var(&limit, "limit", 0, "new limit")
	fs.Float64Var(&mult, "multiplier", 0, "factor applied to the limit, e.g. 2 or 0.5")
	fs.DurationVar(&duration, "duration", 0, "how long the override lasts, e.g. 30m or 24h (required)")
	fs.StringVar(&reason, "reason", "", "why, for the audit (required)")
	fs.StringVar(&id, "id", "", "override `id` (default: a random one); with an id, running the same command again after an error is safe: a stored override is kept, not doubled")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if duration == 0 {
		return cli.Usagef("override set: --duration is required")
	}
	req := admin.OverrideRequest{ID: id, Tier: tier, RuleID: rule, Limit: limit, Multiplier: mult, Duration: duration.String(), Reason: reason}
	targets := 0
	for _, s := range []struct{ dim, id string }{{"user", user}, {"ip", ip}, {"apikey", apiKey}, {"", tier}} {
		if s.id != "" {
			if s.dim != "" {
				req.Dimension, req.Identifier = s.dim, s.id
			}
			targets++
		}
	}
	if targets > 1 {
		return cli.Usagef("override set: name one target: --user, --ip, --api-key or --tier")
	}
	if targets == 0 && rule == "" {
		return cli.Usagef("override set: name a target (--user, --ip, --api-key, --tier) or a --rule")
	}
	o, err := c.CreateOverride(ctx, req)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, report.Override(&o))
	return err
}

func overrideList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("override list", "Lists the overrides not yet expired.", stderr)
	c := registerAdminClient(fs)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	overrides, err := c.Overrides(ctx)
	if err != nil {
		return err
	}
	return report.Overrides(stdout, overrides, time.Now())
}
