package main

import (
	"context"
	"fmt"
	"io"

	"github.com/quotaflow/quotaflow/internal/cli"
)

// quotaflow tier: users' tiers, through a checker's admin API.

var tierGroup = cli.Group{Name: "tier", Usage: help("tier"), Verbs: map[string]cli.Func{
	"set": tierSet,
}}

func tierSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("tier set", "Sets a user's tier (arguments: USER TIER), keeping the user's custom limits.", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.ParseArgs(args, getenv, 2, "USER and TIER")
	if err != nil {
		return err
	}
	if err := c.SetUserTier(ctx, pos[0], pos[1]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "user %s is on tier %s\n", pos[0], pos[1])
	return nil
}
