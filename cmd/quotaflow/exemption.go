package main

import (
	"context"
	"errors"
	"io"
	"strings"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/report"
)

// quotaflow exemption: trusted subjects past chosen rules, through a checker's admin API.

func runExemption(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "exemption", map[string]verb{
		"set": exemptionSet, "list": exemptionList,
		"delete": deleteVerb("exemption", "exemption", "an exemption id", "Removes an exemption (argument: its id).", (*admin.Client).DeleteExemption),
	}, args, getenv, stdout, stderr)
}

func exemptionSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("exemption set", help("exemption-set"), stderr)
	c := registerAdminClient(fs)
	var user, ip, apiKey, dim, value, ruleList, reason string
	fs.StringVar(&user, "user", "", "user id to exempt")
	fs.StringVar(&ip, "ip", "", "client IP or network (CIDR) to exempt")
	fs.StringVar(&apiKey, "api-key", "", "API key to exempt")
	fs.StringVar(&dim, "dimension", "", "custom dimension `name` to exempt a value of (with --value)")
	fs.StringVar(&value, "value", "", "the custom dimension's value")
	fs.StringVar(&ruleList, "rules", "", "comma-separated rule `ids` to exempt from (default: all)")
	fs.StringVar(&reason, "reason", "", "why, for the audit (required)")
	pos, err := fs.parseArgs(args, getenv, 1, "an exemption id")
	if err != nil {
		return err
	}
	if reason == "" {
		return usageError{errors.New("exemption set: --reason is required")}
	}
	e := rules.DocExemption{ID: pos[0], Reason: reason}
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
		return usageError{errors.New("exemption set: name one subject: --user, --ip, --api-key, or --dimension with --value")}
	}
	for _, r := range strings.Split(ruleList, ",") {
		if r = strings.TrimSpace(r); r != "" {
			e.Rules = append(e.Rules, r)
		}
	}
	if err := c.PutExemption(ctx, e); err != nil {
		return err
	}
	return report.Exemptions(stdout, []rules.DocExemption{e})
}

func exemptionList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("exemption list", "Lists the exemptions.", stderr)
	c := registerAdminClient(fs)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	ex, err := c.Exemptions(ctx)
	if err != nil {
		return err
	}
	return report.Exemptions(stdout, ex)
}
