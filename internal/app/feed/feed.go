// Package feed follows quotaflow's streams for people: the decisions as they are made, the
// warning-state transitions, and the override and configuration changes, each printed as one
// line of text or of JSON. It reads with an ephemeral ordered consumer, so following changes
// nothing on the server. `quotaflow watch` is its command.
package feed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// Kind is one thing a feed follows: where it is and how an item reads.
type Kind struct {
	Name     string
	Summary  string // one line, in a list of kinds
	Details  string // a paragraph, in the kind's own help
	Stream   string
	Subjects []string // nil: the whole stream
	One      string   // an item, in help texts
	Many     string
	// print prints the items of one message, at most left of them (0: all), and returns how
	// many it printed.
	print func(out, errs io.Writer, msg jetstream.Msg, left int, asJSON bool) (int, error)
}

// Kinds are the feeds there are; the first is the default.
func Kinds() []Kind {
	return []Kind{
		{"decisions", "every check's decision", `Prints the decision stream as it happens, one line per decision: time, verdict, subject,
endpoint, deciding rule, remaining/limit, state and flags. Reads QUOTAFLOW_DECISIONS with an
ephemeral ordered consumer, so it changes nothing on the server.`, stream.Name, nil, "decision", "decisions", printDecisions},
		{"warnings", "warning-state transitions (normal, warning, throttled)", `Prints the warning-state transitions as they happen, one line each: time, tier, subject,
rule, from → to, usage, remaining/limit and cause. Reads quotaflow.warnings.> of
QUOTAFLOW_EVENTS with an ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.WarningsPrefix + ".>"}, "warning", "warnings",
			printEvent[events.Transition]},
		{"overrides", "overrides created, deleted and expired", `Prints the override changes as they happen, one line each: time, action, override,
target, limit or multiplier, expiry, actor and reason. Reads quotaflow.overrides.> of
QUOTAFLOW_EVENTS with an ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.OverridesPrefix + ".>"}, "override", "overrides",
			printEvent[events.OverrideEvent]},
		{"config", "changes of rules, tiers and users", `Prints the configuration changes as they happen, one line each: time, action, rule or
user (and tier), actor and event id. Reads quotaflow.config.> of QUOTAFLOW_EVENTS with an
ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.ConfigPrefix + ".>"}, "configuration change", "configuration changes",
			printEvent[events.ConfigEvent]},
		{"entitlements", "entitlement thresholds crossed (used %, balance below, a grant expiring)", `Prints the thresholds of entitlements that balances crossed, as they happen, one line each:
time, entitlement, holder, the threshold, what is used and left, and the event id (the
webhook-id its webhooks carry). Reads quotaflow.entitlements.> of QUOTAFLOW_EVENTS with an
ephemeral ordered consumer, so it changes nothing on the server.`, events.Stream, []string{events.EntitlementsPrefix + ".>"}, "entitlement event", "entitlement events",
			printEvent[events.EntitlementEvent]},
	}
}

// Config configures Follow. The zero value follows the kind's stream on 127.0.0.1:4222 from
// now on, as text, until its context ends.
type Config struct {
	NATSURL string // "" means nats://127.0.0.1:4222
	// Credentials authenticates the connection (broker.Client.Credentials): the operator
	// role's, which may read every stream.
	Credentials string
	Stream      string // "" means the kind's stream
	All         bool   // start from the oldest item kept instead of new ones
	JSON        bool   // print each item as one line of JSON
	Count       int    // stop after this many items (0: until ctx ends)
	// Out receives the items, Errs the notes on messages that cannot be decoded (skipped).
	Out, Errs io.Writer
}

// Follow prints the items of kind k as they arrive, until cfg.Count items were printed or ctx
// ends (then it returns nil). It fails when NATS cannot be reached or the stream does not exist.
func Follow(ctx context.Context, k Kind, cfg Config) error {
	if cfg.NATSURL == "" {
		cfg.NATSURL = nats.DefaultURL
	}
	if cfg.Stream == "" {
		cfg.Stream = k.Stream
	}
	if cfg.Errs == nil {
		cfg.Errs = io.Discard
	}
	opts := []nats.Option{nats.Name("quotaflow watch")}
	if cfg.Credentials != "" {
		o, err := broker.CredentialsOption(cfg.Credentials)
		if err != nil {
			return err
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return fmt.Errorf("nats connect %s: %w", cfg.NATSURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	// Said once connected, so that a quiet feed is not taken for a stuck one, and how it ends.
	from, end := "as they happen", "Ctrl-C stops"
	if cfg.All {
		from = "from the oldest kept"
	}
	if cfg.Count > 0 {
		end = fmt.Sprintf("stops after %d", cfg.Count)
	}
	fmt.Fprintf(cfg.Errs, "watching %s on %s %s; %s\n", k.Many, cfg.NATSURL, from, end)
	seen := 0
	return broker.Tail(ctx, js, cfg.Stream, k.Subjects, cfg.All, func(msg jetstream.Msg) (bool, error) {
		left := 0
		if cfg.Count > 0 {
			left = cfg.Count - seen
		}
		n, err := k.print(cfg.Out, cfg.Errs, msg, left, cfg.JSON)
		seen += n
		return cfg.Count > 0 && seen >= cfg.Count, err
	})
}

// printDecisions prints the decisions of one stream message (a batch).
func printDecisions(out, errs io.Writer, msg jetstream.Msg, left int, asJSON bool) (int, error) {
	var b quotaflowv1.DecisionBatch
	if err := proto.Unmarshal(msg.Data(), &b); err != nil {
		fmt.Fprintf(errs, "quotaflow watch: skipping undecodable message on %s: %v\n", msg.Subject(), err)
		return 0, nil
	}
	ds := b.Decisions
	if left > 0 && len(ds) > left {
		ds = ds[:left]
	}
	for _, d := range ds {
		line := stream.Describe(d)
		if asJSON {
			b, err := protojson.Marshal(d)
			if err != nil {
				return 0, fmt.Errorf("encode decision: %w", err)
			}
			line = string(b)
		}
		if _, err := fmt.Fprintln(out, line); err != nil {
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
}](out, _ io.Writer, msg jetstream.Msg, _ int, asJSON bool) (int, error) {
	if asJSON {
		_, err := fmt.Fprintln(out, string(msg.Data()))
		return 1, err
	}
	var e E
	if err := json.Unmarshal(msg.Data(), &e); err != nil {
		_, err = fmt.Fprintf(out, "(undecodable event on %s: %v)\n", msg.Subject(), err)
		return 1, err
	}
	_, err := fmt.Fprintln(out, P(&e).String())
	return 1, err
}
