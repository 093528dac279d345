package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/admin"
)

// The admin commands talk to a checker's admin REST API (/api/v1).

// registerAdminClient adds the flags every admin command shares.
func registerAdminClient(fs *flagSet) *admin.Client {
	c := &admin.Client{}
	var timeout time.Duration
	fs.StringVar(&c.BaseURL, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.fromEnv("target")
	fs.StringVar(&c.Token, "token", "", "admin API bearer `token`")
	fs.fromEnvAs("token", "QUOTAFLOW_ADMIN_TOKEN")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "deadline of the call")
	fs.check(func() error {
		if c.Token == "" {
			return errors.New("--token (or QUOTAFLOW_ADMIN_TOKEN) is required: the admin API needs a bearer token")
		}
		if _, err := url.Parse(c.BaseURL); err != nil {
			return fmt.Errorf("--target: %w", err)
		}
		c.HTTP = &http.Client{Timeout: timeout}
		return nil
	})
	return c
}

// verb runs one verb of a command group (quotaflow rules list) with the verb's arguments.
type verb = func(context.Context, []string, func(string) string, io.Writer, io.Writer) error

// subcommand dispatches "quotaflow <group> <verb> ...", whose verbs help/<group>.txt lists.
func subcommand(ctx context.Context, group string, verbs map[string]verb,
	args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	verbHelp := help(group) + "\n"
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stdout, "Usage:\n%s\nRun quotaflow %s <verb> --help for a verb's flags.\n", verbHelp, group)
		if len(args) == 0 {
			return usageError{fmt.Errorf("%s: name a verb", group)}
		}
		return nil
	}
	run, ok := verbs[args[0]]
	if !ok {
		return usageError{fmt.Errorf("%s: unknown verb %q\nUsage:\n%s", group, args[0], verbHelp)}
	}
	return run(ctx, args[1:], getenv, stdout, stderr)
}

// deleteVerb is the delete verb of the group of noun: it removes the item its one argument
// (anID) names with del, and says so.
func deleteVerb(group, noun, anID, synopsis string, del func(*admin.Client, context.Context, string) error) verb {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		fs := newFlagSet(group+" delete", synopsis, stderr)
		c := registerAdminClient(fs)
		pos, err := fs.parseArgs(args, getenv, 1, anID)
		if err != nil {
			return err
		}
		if err := del(c, ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted %s %s\n", noun, pos[0])
		return nil
	}
}
