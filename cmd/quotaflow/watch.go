package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

func runWatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "decisions" && !strings.HasPrefix(args[0], "-")) {
		what := "nothing"
		if len(args) > 0 {
			what = fmt.Sprintf("%q", args[0])
		}
		return usageError{fmt.Errorf("watch: want `quotaflow watch decisions`, got %s", what)}
	}
	if args[0] == "decisions" {
		args = args[1:]
	}
	fs := newFlagSet("watch decisions", `Prints the decision stream as it happens, one line per decision: time, verdict, subject,
endpoint, deciding rule, remaining/limit, state and flags. Reads QUOTAFLOW_DECISIONS with an
ephemeral ordered consumer, so it changes nothing on the server.`, stderr)
	var (
		natsURL, stream string
		all, asJSON     bool
		count           int
	)
	fs.StringVar(&natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.fromEnv("nats-url", "QUOTAFLOW_NATS_URL")
	fs.StringVar(&stream, "stream", "QUOTAFLOW_DECISIONS", "stream to read")
	fs.BoolVar(&all, "all", false, "start from the oldest decision kept instead of new ones")
	fs.BoolVar(&asJSON, "json", false, "print each decision as one line of JSON")
	fs.IntVar(&count, "count", 0, "stop after this many decisions (0: until interrupted)")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL, nats.Name("quotaflow watch"))
	if err != nil {
		return fmt.Errorf("nats connect %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	deliver := jetstream.DeliverNewPolicy
	if all {
		deliver = jetstream.DeliverAllPolicy
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: deliver})
	if err != nil {
		return fmt.Errorf("watch %s: %w", stream, err)
	}
	seen := 0
	for ctx.Err() == nil {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("fetch: %w", err)
		}
		for msg := range batch.Messages() {
			var b quotaflowv1.DecisionBatch
			if err := proto.Unmarshal(msg.Data(), &b); err != nil {
				fmt.Fprintf(stderr, "quotaflow watch: skipping undecodable message on %s: %v\n", msg.Subject(), err)
				continue
			}
			for _, d := range b.Decisions {
				if err := printDecision(stdout, d, asJSON); err != nil {
					return err
				}
				if seen++; count > 0 && seen >= count {
					return nil
				}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			return fmt.Errorf("fetch: %w", err)
		}
	}
	return nil
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
	verdict := "ALLOW"
	if !d.Allowed {
		verdict = "DENY "
	}
	subject := "-"
	if s := d.Subject; s != nil {
		subject = strings.ToLower(strings.TrimPrefix(s.Dimension.String(), "DIMENSION_")) + ":" + s.Identifier
	}
	rule := "(no rule)"
	if d.RuleId != "" {
		rule = fmt.Sprintf("%s %d/%d", d.RuleId, d.Remaining, d.Limit)
	}
	var flags []string
	if d.Shadow {
		flags = append(flags, "shadow-deny")
	}
	if d.Degraded {
		flags = append(flags, "degraded:"+d.FailMode)
	}
	if d.Replayed {
		flags = append(flags, "replayed")
	}
	if !d.Allowed {
		flags = append(flags, fmt.Sprintf("retry=%dms", d.RetryAfterMs))
	}
	_, err := fmt.Fprintf(w, "%s %s %-24s %-24s %-28s %-8s tier=%s id=%s %s\n",
		time.UnixMicro(d.TimeUs).UTC().Format("15:04:05.000000"), verdict, subject, d.Endpoint, rule,
		strings.ToLower(strings.TrimPrefix(d.State.String(), "STATE_")), d.Tier, d.Id, strings.Join(flags, " "))
	return err
}
