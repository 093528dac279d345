package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/term"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The terminal's escapes that top uses: the alternate screen keeps the operator's scrollback
// as it was, and the cursor is hidden while the screen is redrawn.
const (
	enterScreen = "\x1b[?1049h\x1b[?25l"
	leaveScreen = "\x1b[?25h\x1b[?1049l"
	redraw      = "\x1b[H\x1b[2J"
)

// topOptions are top's flags.
type topOptions struct {
	natsURL, creds   string
	interval, window time.Duration
	since            time.Duration
	rows             int
}

func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", `A live terminal view for operators on a server without a browser: the busiest subjects over
the last --window (checks per second, allowed and denied), from the decision stream, and the
subjects warned or throttled now, from the warning transitions of the events stream (read
back --since to know the current ones). The screen is redrawn every --interval; q or Ctrl-C
quits and gives the terminal back as it was. Reads both streams with ephemeral ordered
consumers, so it changes nothing on the server.

When stdout is not a terminal (a pipe, a file), it prints one snapshot after the first
--interval and exits, so that top | mail or a cron job gets plain text.`, stderr)
	var o topOptions
	fs.StringVar(&o.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.DurationVar(&o.interval, "interval", time.Second, "how often the screen is redrawn")
	fs.DurationVar(&o.window, "window", 10*time.Second, "the sliding window the subjects' checks are counted over (whole seconds)")
	fs.DurationVar(&o.since, "since", time.Hour, "how far back warning transitions are read to know who is throttled now")
	fs.IntVar(&o.rows, "rows", 20, "most subjects and throttles listed (fewer when the terminal is shorter)")
	fs.fromEnv("nats-url")
	registerReaderCreds(fs, &o.creds)
	fs.check(o.validate)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	nc, err := readerConn(o.natsURL, "quotaflow top", o.creds)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	board := newTopBoard(o.window)
	stop, err := followTop(ctx, js, board, o.since)
	if err != nil {
		return err
	}
	defer stop()
	out, ok := stdout.(*os.File)
	if !ok || !term.IsTerminal(int(out.Fd())) || !term.IsTerminal(int(os.Stdin.Fd())) {
		return topSnapshot(ctx, board, o, stdout)
	}
	return topScreen(ctx, board, o, out, os.Stdin)
}

func (o *topOptions) validate() error {
	switch {
	case o.interval < 10*time.Millisecond:
		return fmt.Errorf("--interval: want at least 10ms, got %s", o.interval)
	case o.window < time.Second || o.window%time.Second != 0:
		return fmt.Errorf("--window: want whole seconds, at least 1s, got %s", o.window)
	case o.since < 0:
		return fmt.Errorf("--since: want 0 or more, got %s", o.since)
	case o.rows < 1:
		return fmt.Errorf("--rows: want at least 1, got %d", o.rows)
	case !strings.HasPrefix(o.natsURL, "nats://") && !strings.HasPrefix(o.natsURL, "tls://"):
		return fmt.Errorf("--nats-url: want a nats:// or tls:// URL, got %q", o.natsURL)
	}
	return nil
}

// followTop feeds board from the decision stream (new decisions only) and the warning
// transitions since since ago. The consumers exist when it returns: nothing decided after is
// missed. A missing events stream (no aggregator ever ran) is a note on the screen; a missing
// decision stream is an error.
func followTop(ctx context.Context, js jetstream.JetStream, board *topBoard, since time.Duration) (stop func(), err error) {
	dec, err := js.OrderedConsumer(ctx, stream.Name, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("no decision stream %s on this NATS: start a checker with --nats-url first", stream.Name)
	} else if err != nil {
		return nil, fmt.Errorf("follow %s: %w", stream.Name, err)
	}
	decs, err := dec.Consume(func(msg jetstream.Msg) {
		var b quotaflowv1.DecisionBatch
		if proto.Unmarshal(msg.Data(), &b) == nil {
			board.addBatch(time.Now(), &b)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", stream.Name, err)
	}
	start := time.Now().Add(-since)
	ev, err := js.OrderedConsumer(ctx, events.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.WarningsPrefix + ".>"}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
	if err != nil {
		board.setNote(fmt.Sprintf("throttles not shown: %s: %v", events.Stream, err))
		return decs.Stop, nil
	}
	evs, err := ev.Consume(func(msg jetstream.Msg) {
		var t events.Transition
		if json.Unmarshal(msg.Data(), &t) == nil {
			board.applyTransition(t)
		}
	})
	if err != nil {
		decs.Stop()
		return nil, fmt.Errorf("follow %s: %w", events.Stream, err)
	}
	return func() { decs.Stop(); evs.Stop() }, nil
}

// topSnapshot prints the board once, after the first interval.
func topSnapshot(ctx context.Context, board *topBoard, o topOptions, w io.Writer) error {
	select {
	case <-ctx.Done():
	case <-time.After(o.interval):
	}
	_, err := fmt.Fprintln(w, strings.Join(board.frame(time.Now(), 0, o.rows), "\n"))
	return err
}

// topScreen redraws the board on the terminal every interval until q, Ctrl-C or ctx's end,
// then gives the terminal back as it was: its mode, the cursor and the screen.
func topScreen(ctx context.Context, board *topBoard, o topOptions, out, in *os.File) error {
	state, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	defer term.Restore(int(in.Fd()), state)
	io.WriteString(out, enterScreen)
	defer io.WriteString(out, leaveScreen)
	quit := make(chan struct{})
	go readKeys(in, quit)
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		width, height, err := term.GetSize(int(out.Fd()))
		if err != nil {
			width, height = 0, 0
		}
		rows := o.rows
		if height > 0 {
			rows = max(1, min(rows, (height-9)/2)) // the headers take 9 lines
		}
		// Raw mode sends \n as is: each line returns the carriage itself.
		if _, err := io.WriteString(out, redraw+strings.Join(board.frame(time.Now(), width, rows), "\r\n")); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-quit:
			return nil
		case <-t.C:
		}
	}
}

// readKeys closes quit at q, Q or Ctrl-C (raw mode delivers it as a byte, not a signal), or
// when the terminal closes. It returns then; until then it blocks reading: the process ends
// soon after top returns.
func readKeys(in io.Reader, quit chan<- struct{}) {
	defer close(quit)
	buf := make([]byte, 16)
	for {
		n, err := in.Read(buf)
		for _, c := range buf[:n] {
			if c == 'q' || c == 'Q' || c == 3 {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
