package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/events"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// watchTarget is one stream quotaflow watch prints.
type watchTarget struct {
	name     string
	summary  string // one line, in the list of targets
	details  string // the target's own help
	stream   string
	subjects []string // nil: the whole stream
	one      string   // an item, in the flags' help
	many     string
}

func watchTargets() []watchTarget {
	return []watchTarget{
		{"decisions", "every check's decision", `Prints the decision stream as it happens, one line per decision: time, verdict, subject,
endpoint, deciding rule, remaining/limit, state and flags. Reads QUOTAFLOW_DECISIONS with an
ephemeral ordered consumer, so it changes nothing on the server.`, stream.Name, nil, "decision", "decisions"},
		{"warnings", "warning-state transitions (normal, warning, throttled)", `Prints the warning-state transitions as they happen, one line each: time, tier, subject,
rule, from → to, usage, remaining/limit and cause. Reads quotaflow.warnings.> of
QUOTAFLOW_EVENTS with an ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.WarningsPrefix + ".>"}, "warning", "warnings"},
		{"overrides", "overrides created, deleted and expired", `Prints the override changes as they happen, one line each: time, action, override,
target, limit or multiplier, expiry, actor and reason. Reads quotaflow.overrides.> of
QUOTAFLOW_EVENTS with an ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.OverridesPrefix + ".>"}, "override", "overrides"},
		{"config", "changes of rules, tiers and users", `Prints the configuration changes as they happen, one line each: time, action, rule or
user (and tier), actor and event id. Reads quotaflow.config.> of QUOTAFLOW_EVENTS with an
ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.ConfigPrefix + ".>"}, "configuration change", "configuration changes"},
	}
}

func runWatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	targets := watchTargets()
	name := targets[0].name
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	var t *watchTarget
	var list strings.Builder
	names := make([]string, len(targets))
	for i := range targets {
		names[i] = targets[i].name
		fmt.Fprintf(&list, "\n  %-10s %s", targets[i].name, targets[i].summary)
		if targets[i].name == name {
			t = &targets[i]
		}
	}
	if t == nil {
		return usageError{fmt.Errorf("watch: want `quotaflow watch decisions|warnings|overrides` or `quotaflow watch config`, got %q", name)}
	}
	// Every target is listed, whichever one's help is asked for: quotaflow watch --help is the
	// help of the default, decisions.
	fs := newFlagSet("watch "+t.name, "Targets (default "+targets[0].name+"):"+list.String()+"\n\n"+t.details, stderr)
	fs.usageLine = "watch [" + strings.Join(names, "|") + "]"
	var (
		natsURL, stream string
		all, asJSON     bool
		count           int
	)
	fs.StringVar(&natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.fromEnv("nats-url")
	fs.StringVar(&stream, "stream", t.stream, "stream to read")
	fs.BoolVar(&all, "all", false, "start from the oldest "+t.one+" kept instead of new ones")
	fs.BoolVar(&asJSON, "json", false, "print each "+t.one+" as one line of JSON")
	fs.IntVar(&count, "count", 0, "stop after this many "+t.many+" (0: until interrupted)")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	print := func(msg jetstream.Msg, left int) (int, error) {
		return printDecisions(stdout, stderr, msg, left, asJSON)
	}
	switch t.name {
	case "warnings":
		print = func(msg jetstream.Msg, _ int) (int, error) {
			return 1, printEvent[events.Transition](stdout, msg, asJSON, "transition")
		}
	case "overrides":
		print = func(msg jetstream.Msg, _ int) (int, error) {
			return 1, printEvent[events.OverrideEvent](stdout, msg, asJSON, "override event")
		}
	case "config":
		print = func(msg jetstream.Msg, _ int) (int, error) {
			return 1, printEvent[events.ConfigEvent](stdout, msg, asJSON, "config event")
		}
	}
	return watchStream(ctx, natsURL, stream, t.subjects, all, count, print)
}

// watchStream tails a stream and hands each message to print, with how many items may still
// be printed (0: no bound), until count items were printed or ctx ends. print returns how many
// it printed.
func watchStream(ctx context.Context, natsURL, stream string, subjects []string, all bool, count int, print func(msg jetstream.Msg, left int) (int, error)) error {
	nc, err := nats.Connect(natsURL, nats.Name("quotaflow watch"))
	if err != nil {
		return fmt.Errorf("nats connect %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	seen := 0
	return broker.Tail(ctx, js, stream, subjects, all, func(msg jetstream.Msg) (bool, error) {
		left := 0
		if count > 0 {
			left = count - seen
		}
		n, err := print(msg, left)
		seen += n
		return count > 0 && seen >= count, err
	})
}

// printDecisions prints the decisions of one stream message, at most left of them (0: all).
func printDecisions(stdout, stderr io.Writer, msg jetstream.Msg, left int, asJSON bool) (int, error) {
	var b quotaflowv1.DecisionBatch
	if err := proto.Unmarshal(msg.Data(), &b); err != nil {
		fmt.Fprintf(stderr, "quotaflow watch: skipping undecodable message on %s: %v\n", msg.Subject(), err)
		return 0, nil
	}
	ds := b.Decisions
	if left > 0 && len(ds) > left {
		ds = ds[:left]
	}
	for _, d := range ds {
		if err := printDecision(stdout, d, asJSON); err != nil {
			return 0, err
		}
	}
	return len(ds), nil
}

// printEvent prints one event of the events stream (a warning transition, an override or
// configuration change): its JSON as sent, or its one-line String.
func printEvent[E any, P interface {
	*E
	fmt.Stringer
}](w io.Writer, msg jetstream.Msg, asJSON bool, kind string) error {
	if asJSON {
		_, err := fmt.Fprintln(w, string(msg.Data()))
		return err
	}
	var e E
	if err := json.Unmarshal(msg.Data(), &e); err != nil {
		_, err = fmt.Fprintf(w, "(undecodable %s on %s: %v)\n", kind, msg.Subject(), err)
		return err
	}
	_, err := fmt.Fprintln(w, P(&e).String())
	return err
}

func printDecision(w io.Writer, d *quotaflowv1.Decision, asJSON bool) error {
	if asJSON {
		b, err := protojson.Marshal(d)
		if err != nil {
			return fmt.Errorf("encode decision: %w", err)
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	}
	_, err := fmt.Fprintln(w, stream.Describe(d))
	return err
}
