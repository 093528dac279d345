package main

import (
	"context"
	"fmt"
	"io"
)

// quotaflow tier: users' tiers, through a checker's admin API.

func runTier(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "tier", map[string]verb{
		"set": tierSet,
	}, args, getenv, stdout, stderr)
}

func tierSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tier set", "Sets a user's tier (arguments: USER TIER), keeping the user's custom limits.", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.parseArgs(args, getenv, 2, "USER and TIER")
	if err != nil {
		return err
	}
	if err := c.SetUserTier(ctx, pos[0], pos[1]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "user %s is on tier %s\n", pos[0], pos[1])
	return nil
}
