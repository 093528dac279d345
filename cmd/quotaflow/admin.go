package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/checker/admin"
	"github.com/quotaflow/quotaflow/checker/rules"
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

// subcommand dispatches "quotaflow <group> <verb> ...".
func subcommand(ctx context.Context, group string, verbs map[string]func(context.Context, []string, func(string) string, io.Writer, io.Writer) error,
	help string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stdout, "Usage:\n%s\nRun quotaflow %s <verb> --help for a verb's flags.\n", help, group)
		if len(args) == 0 {
			return usageError{fmt.Errorf("%s: name a verb", group)}
		}
		return nil
	}
	run, ok := verbs[args[0]]
	if !ok {
		return usageError{fmt.Errorf("%s: unknown verb %q\nUsage:\n%s", group, args[0], help)}
	}
	return run(ctx, args[1:], getenv, stdout, stderr)
}

const rulesHelp = `  quotaflow rules list              the rules of the rule store
  quotaflow rules get ID            one rule, as YAML
  quotaflow rules apply -f FILE     replace rules, tiers, users and policies with a rules file
  quotaflow rules delete ID         remove a rule (refused while a user's limit names it)
`

func runRules(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "rules", map[string]func(context.Context, []string, func(string) string, io.Writer, io.Writer) error{
		"list": rulesList, "get": rulesGet, "apply": rulesApply, "delete": rulesDelete,
	}, rulesHelp, args, getenv, stdout, stderr)
}

func rulesList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules list", "Lists the rules of the rule store through a checker's admin API.", stderr)
	c := registerAdminClient(fs)
	asJSON := fs.Bool("json", false, "print the whole rules document as JSON")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	raw, err := c.Rules(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		var b bytes.Buffer
		json.Indent(&b, raw, "", "  ")
		fmt.Fprintln(stdout, b.String())
		return nil
	}
	var doc rules.Document
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("decode rules: %w", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDIMENSION\tENDPOINT\tTIER\tALGORITHM\tLIMIT\tWINDOW\tBURST\tFLAGS")
	for _, r := range doc.Rules {
		var flags []string
		if r.Shadow == "true" {
			flags = append(flags, "shadow")
		}
		if r.FailMode != "" {
			flags = append(flags, "fail_mode="+r.FailMode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Dimension, r.Endpoint, dash(r.Tier), r.Algorithm,
			r.Limit, r.Window, dash(string(r.Burst)), dash(strings.Join(flags, ",")))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func rulesGet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules get", "Prints one rule (argument: its id) as YAML, as a rules file writes it.", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.parseArgs(args, getenv, 1, "a rule id")
	if err != nil {
		return err
	}
	raw, err := c.Rule(ctx, pos[0])
	if err != nil {
		return err
	}
	// JSON is YAML: read as a node tree it keeps the fields' order and numbers as numbers
	// (rules.Scalar would encode them quoted); dropping the styles prints block YAML.
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("decode rule: %w", err)
	}
	plainStyle(&n)
	return yaml.NewEncoder(stdout).Encode(&n)
}

func plainStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plainStyle(c)
	}
}

func rulesApply(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules apply", `Replaces the rule store's whole configuration (rules, tiers, users, warnings, policies) with a
rules file; overrides stay. The checker validates it as a whole: a file with any problem
changes nothing. Every checker enforces the new rules within a fraction of a second.`, stderr)
	c := registerAdminClient(fs)
	file := fs.String("f", "", "rules `file` (YAML or JSON; required)")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if *file == "" {
		return usageError{errors.New("rules apply: -f FILE is required")}
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("read rules file: %w", err)
	}
	doc, err := rules.Decode(data)
	if err != nil {
		return fmt.Errorf("rules file %s: %w", *file, err)
	}
	// The checker validates the document again, but only here do its problems have the file's
	// lines, and are they printed once (the API's error lists them in its message and again).
	if _, err := doc.Compile(); err != nil {
		return fmt.Errorf("rules file %s: refused, nothing was changed: %w", *file, err)
	}
	n, users, err := c.ApplyRules(ctx, doc)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %s: %d rules, %d users\n", *file, n, users)
	return nil
}

func rulesDelete(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rules delete", "Removes one rule (argument: its id).", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.parseArgs(args, getenv, 1, "a rule id")
	if err != nil {
		return err
	}
	if err := c.DeleteRule(ctx, pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "deleted rule %s\n", pos[0])
	return nil
}

const overrideHelp = `  quotaflow override set [--user ID|--ip IP|--api-key KEY|--tier T] [--rule RULE] (--limit N|--multiplier F) --duration D --reason TEXT
  quotaflow override list
  quotaflow override delete ID
`

func runOverride(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "override", map[string]func(context.Context, []string, func(string) string, io.Writer, io.Writer) error{
		"set": overrideSet, "list": overrideList, "delete": overrideDelete,
	}, overrideHelp, args, getenv, stdout, stderr)
}

func overrideSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("override set", `Changes a limit for a while: a subject's (--user, --ip, --api-key), a tier's (--tier) or, with
--rule alone, one rule's for everyone. --rule narrows a subject's or tier's override to that
rule. --limit replaces the limit (what was consumed is kept: 90 used of 100 raised to 200 leaves
110); --multiplier scales it. The override vanishes by itself after --duration.`, stderr)
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
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if duration == 0 {
		return usageError{errors.New("override set: --duration is required")}
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
		return usageError{errors.New("override set: name one target: --user, --ip, --api-key or --tier")}
	}
	if targets == 0 && rule == "" {
		return usageError{errors.New("override set: name a target (--user, --ip, --api-key, --tier) or a --rule")}
	}
	o, err := c.CreateOverride(ctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "override %s: %s %s until %s\n", o.ID, overrideTarget(&o), overrideChange(&o), o.ExpiresAt.Local().Format(time.RFC3339))
	return nil
}

func overrideTarget(o *rules.Override) string {
	var t string
	switch o.Target() {
	case "subject":
		t = o.Dimension + ":" + o.Identifier
	case "tier":
		t = "tier:" + o.Tier
	default:
		return "rule:" + o.RuleID
	}
	if o.RuleID != "" {
		t += " rule:" + o.RuleID
	}
	return t
}

func overrideChange(o *rules.Override) string {
	if o.Multiplier != 0 {
		return "limit×" + strconv.FormatFloat(o.Multiplier, 'g', -1, 64)
	}
	return "limit=" + strconv.FormatInt(o.Limit, 10)
}

func overrideList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("override list", "Lists the overrides not yet expired.", stderr)
	c := registerAdminClient(fs)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	overrides, err := c.Overrides(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTARGET\tCHANGE\tEXPIRES\tLEFT\tSOURCE\tCREATOR\tREASON")
	for _, o := range overrides {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.ID, overrideTarget(&o), overrideChange(&o),
			o.ExpiresAt.Local().Format(time.RFC3339), time.Until(o.ExpiresAt).Round(time.Second), o.Source, o.Creator, o.Reason)
	}
	return tw.Flush()
}

func overrideDelete(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("override delete", "Removes an override (argument: its id) before its expiry.", stderr)
	c := registerAdminClient(fs)
	pos, err := fs.parseArgs(args, getenv, 1, "an override id")
	if err != nil {
		return err
	}
	if err := c.DeleteOverride(ctx, pos[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "deleted override %s\n", pos[0])
	return nil
}

const tierHelp = `  quotaflow tier set USER TIER      move a user to a tier (what the user consumed is kept)
`

func runTier(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return subcommand(ctx, "tier", map[string]func(context.Context, []string, func(string) string, io.Writer, io.Writer) error{
		"set": tierSet,
	}, tierHelp, args, getenv, stdout, stderr)
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
