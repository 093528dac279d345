package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/admin"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// quotaflow rules: the rules of the rule store, through a checker's admin API.

var rulesGroup = cli.Group{Name: "rules", Usage: help("rules"), Verbs: map[string]cli.Func{
	"list": rulesList, "get": rulesGet, "apply": rulesApply, "delete": deleteVerb("rules", "rule", "a rule id", "Removes one rule (argument: its id).", (*admin.Client).DeleteRule),
	"import-envoy": rulesImportEnvoy,
}}

func rulesList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("rules list", "Lists the rules of the rule store through a checker's admin API.", stderr)
	c := registerAdminClient(fs)
	asJSON := fs.Bool("json", false, "print the whole rules document as JSON")
	wide := fs.Bool("wide", false, fmt.Sprintf("print every column (burst, flags, descriptors) in full, not fit to %d columns", report.Width))
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	raw, err := c.Rules(ctx)
	if err != nil {
		return err
	}
	return report.RulesDocument(stdout, raw, *asJSON, *wide)
}

func rulesGet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("rules get", "Prints one rule (argument: its id) as YAML, as a rules file writes it.", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.ParseArgs(args, getenv, 1, "a rule id")
	if err != nil {
		return err
	}
	raw, err := c.Rule(ctx, pos[0])
	if err != nil {
		return err
	}
	return report.RuleYAML(stdout, raw)
}

func rulesApply(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("rules apply", help("rules-apply"), stderr)
	c := registerAdminClient(fs)
	file := fs.String("f", "", "rules `file` (YAML or JSON; required)")
	var opts rules.ApplyOptions
	fs.BoolVar(&opts.Prune, "prune", false, "remove what the store holds and the file lacks")
	fs.BoolVar(&opts.DryRun, "dry-run", false, "print what would change, and change nothing")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if *file == "" {
		return cli.Usagef("rules apply: -f FILE is required")
	}
	res, err := c.ApplyRulesFile(ctx, *file, opts)
	if ae := (*admin.Error)(nil); errors.As(err, &ae) && ae.Code == "failed_precondition" {
		report.Lacking(stdout, ae.Problems)
		return fmt.Errorf("rules file %s: refused, nothing was changed: the file lacks %d item(s) the rule store holds (listed above); add them to the file, or apply with --prune to remove them", *file, len(ae.Problems))
	}
	if err != nil {
		return err
	}
	report.Applied(stdout, *file, res.Rules, res.Users, res.Changes, opts.DryRun)
	return nil
}

func rulesImportEnvoy(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("rules import-envoy", help("rules-import-envoy"), stderr)
	out := fs.String("out", "", "write the rules `file` here instead of standard output")
	paths, err := fs.ParseArgs(args, getenv, -1, "one or more configuration files or directories")
	if err != nil {
		return err
	}
	doc, err := rules.ImportEnvoy(paths...)
	if err != nil {
		return err
	}
	if _, err := doc.Compile(); err != nil {
		return fmt.Errorf("rules import-envoy: the converted rules are refused: %w", err)
	}
	b, err := report.RulesFile(doc, "Converted by quotaflow rules import-envoy from "+strings.Join(paths, ", "))
	if err != nil {
		return err
	}
	if *out == "" {
		_, err := stdout.Write(b)
		return err
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		return fmt.Errorf("rules import-envoy: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s: %d rules\n", *out, len(doc.Rules))
	return nil
}
