package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// quotaflow grant: the grants of entitlements' balances; quotaflow webhook: the endpoints of
// their events. Both through a checker's admin API.

var grantGroup = cli.Group{Name: "grant", Usage: help("grant"), Verbs: map[string]cli.Func{
	"add": grantAdd, "list": grantVerb("list", "Prints a subject's balance of an entitlement and its grants.", 0),
	"void": grantVerb("void", "Voids a grant (argument: its id) from now on; what it paid for stays paid.", 1),
}}

func grantAdd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("grant add", help("grant"), stderr)
	c := registerAdminClient(fs)
	var g rules.Grant
	var roll rules.Rollover
	fs.StringVar(&g.Entitlement, "entitlement", "", "the entitlement's `id` (required)")
	fs.StringVar(&g.Subject, "subject", "", "who holds it, of the entitlement's dimension (required)")
	fs.Int64Var(&g.Amount, "amount", 0, "what it gives (required)")
	fs.IntVar(&g.Priority, "priority", 1, "1 burns first, up to 1000")
	fs.TextVar(&g.ExpiresAt, "expires", time.Time{}, "when it stops counting, an RFC 3339 `time` (default: never)")
	fs.BoolVar(&g.Recurring, "recurring", false, "issue it again, whole, at every period's start")
	fs.Int64Var(&roll.Max, "rollover-max", 0, "recurring: the most of what a period leaves unused carried into the next")
	fs.Int64Var(&roll.Min, "rollover-min", 0, "recurring: the least carried into the next period")
	fs.StringVar(&g.ID, "id", "", "the grant's `id` (default: drawn); with one, running the command again is safe")
	fs.StringVar(&g.Reason, "reason", "", "why, for the audit (required)")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if roll != (rules.Rollover{}) {
		g.Rollover = &roll
	}
	res, err := c.CreateGrant(ctx, g)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "grant %s: %d of %s to %s:%s\n", res.Grant.ID, res.Grant.Amount, res.Grant.Entitlement, res.Grant.Dimension, res.Grant.Subject)
	return report.Balance(stdout, res.Balance, time.Now())
}

// grantVerb is list (no argument) or void (a grant's id): both name an entitlement and a
// subject, and print the balance after.
func grantVerb(verb, synopsis string, n int) cli.Func {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		fs := cli.NewFlagSet("grant "+verb, synopsis, stderr)
		c := registerAdminClient(fs)
		ent := fs.String("entitlement", "", "the entitlement's `id` (required)")
		sub := fs.String("subject", "", "who holds it (required)")
		pos, err := fs.ParseArgs(args, getenv, n, map[int]string{0: "no argument", 1: "a grant id"}[n])
		if err != nil {
			return err
		}
		var b admin.BalanceView
		if n == 0 {
			b, err = c.Grants(ctx, *ent, *sub)
		} else {
			var res admin.GrantResult
			res, err = c.VoidGrant(ctx, *ent, *sub, pos[0])
			b = res.Balance
		}
		if err != nil {
			return err
		}
		return report.Balance(stdout, b, time.Now())
	}
}

var webhookGroup = cli.Group{Name: "webhook", Usage: help("webhook"), Verbs: map[string]cli.Func{
	"set": webhookSet, "list": webhookList,
	"delete":     deleteVerb("webhook", "webhook endpoint", "an endpoint id", "Removes a webhook endpoint (argument: its id).", (*admin.Client).DeleteWebhook),
	"deliveries": webhookDeliveries,
}}

func webhookSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("webhook set", help("webhook"), stderr)
	c := registerAdminClient(fs)
	var req admin.WebhookRequest
	fs.StringVar(&req.URL, "url", "", "where the events are POSTed (required)")
	fs.StringVar(&req.Secret, "secret", "", "its signing secret, whsec_… (default: drawn for a new endpoint, kept for one replaced)")
	fs.ListVar(&req.Filter, "events", "comma-separated event `types` it takes (entitlement.used_percent, …; default: all)")
	fs.BoolVar(&req.Disabled, "disabled", false, "pause it: its events wait")
	pos, err := fs.ParseArgs(args, getenv, 1, "an endpoint id")
	if err != nil {
		return err
	}
	ep, err := c.PutWebhook(ctx, pos[0], req)
	if err != nil {
		return err
	}
	if ep.Secret != "" {
		fmt.Fprintf(stdout, "secret %s (shown once: give it to the receiver)\n", ep.Secret)
	}
	return report.Webhooks(stdout, []admin.EndpointView{ep})
}

func webhookList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("webhook list", "Lists the webhook endpoints.", stderr)
	c := registerAdminClient(fs)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	eps, err := c.Webhooks(ctx)
	if err != nil {
		return err
	}
	return report.Webhooks(stdout, eps)
}

func webhookDeliveries(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("webhook deliveries", "Prints an endpoint's latest delivery attempts (argument: its id).", stderr)
	c := registerAdminClient(fs)
	n := fs.Int("n", 20, "how many, up to 500")
	pos, err := fs.ParseArgs(args, getenv, 1, "an endpoint id")
	if err != nil {
		return err
	}
	ds, err := c.WebhookDeliveries(ctx, pos[0], *n)
	if err != nil {
		return err
	}
	return report.Deliveries(stdout, ds)
}
