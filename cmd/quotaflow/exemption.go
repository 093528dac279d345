package main

import (
	"context"
	"io"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// quotaflow exemption: trusted subjects past chosen rules, through a checker's admin API.

var exemptionGroup = cli.Group{Name: "exemption", Usage: help("exemption"), Verbs: map[string]cli.Func{
	"set": exemptionSet, "list": exemptionList,
	"delete": deleteVerb("exemption", "exemption", "an exemption id", "Removes an exemption (argument: its id).", (*admin.Client).DeleteExemption),
}}

func exemptionSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("exemption set", help("exemption-set"), stderr)
	c := registerAdminClient(fs)
	var user, ip, apiKey, dim, value string
	var e rules.DocExemption
	fs.StringVar(&user, "user", "", "user id to exempt")
	fs.StringVar(&ip, "ip", "", "client IP or network (CIDR) to exempt")
	fs.StringVar(&apiKey, "api-key", "", "API key to exempt")
	fs.StringVar(&dim, "dimension", "", "custom dimension `name` to exempt a value of (with --value)")
	fs.StringVar(&value, "value", "", "the custom dimension's value")
	fs.ListVar(&e.Rules, "rules", "comma-separated rule `ids` to exempt from (default: all)")
	fs.StringVar(&e.Reason, "reason", "", "why, for the audit (required)")
	pos, err := fs.ParseArgs(args, getenv, 1, "an exemption id")
	if err != nil {
		return err
	}
	if e.Reason == "" {
		return cli.Usagef("exemption set: --reason is required")
	}
	e.ID = pos[0]
	targets := 0
	for _, s := range []struct{ dim, v string }{{"user", user}, {"ip", ip}, {"apikey", apiKey}} {
		if s.v != "" {
			e.Dimension, e.Value = s.dim, s.v
			targets++
		}
	}
	if dim != "" || value != "" { // the server names what is missing of the two
		e.Dimension, e.Value = dim, value
		targets++
	}
	if targets != 1 {
		return cli.Usagef("exemption set: name one subject: --user, --ip, --api-key, or --dimension with --value")
	}
	if err := c.PutExemption(ctx, e); err != nil {
		return err
	}
	return report.Exemptions(stdout, []rules.DocExemption{e})
}

func exemptionList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("exemption list", "Lists the exemptions.", stderr)
	c := registerAdminClient(fs)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	ex, err := c.Exemptions(ctx)
	if err != nil {
		return err
	}
	return report.Exemptions(stdout, ex)
}
