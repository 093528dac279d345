package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// The admin commands talk to a checker's admin REST API (/api/v1).

// registerAdminClient adds the flags every admin command shares.
func registerAdminClient(fs *cli.FlagSet) *admin.Client {
	c := &admin.Client{}
	var timeout time.Duration
	fs.StringVar(&c.BaseURL, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.FromEnv("target")
	fs.StringVar(&c.Token, "token", "", "admin API bearer `token`")
	fs.FromEnvAs("token", "QUOTAFLOW_ADMIN_TOKEN")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "deadline of the call")
	fs.Check(func() error {
		if c.Token == "" && fileExists(filepath.Join(".dev", "nats", "auth", "operator.nk")) {
			return errors.New("--token is required: the admin API needs a bearer token; make dev's is dev-admin-token (export QUOTAFLOW_ADMIN_TOKEN=dev-admin-token)")
		} else if c.Token == "" {
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

// deleteVerb is the delete verb of the group of noun: it removes the item its one argument
// (anID) names with del, and says so.
func deleteVerb(group, noun, anID, synopsis string, del func(*admin.Client, context.Context, string) error) cli.Func {
	return func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		fs := cli.NewFlagSet(group+" delete", synopsis, stderr)
		c := registerAdminClient(fs)
		pos, err := fs.ParseArgs(args, getenv, 1, anID)
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
