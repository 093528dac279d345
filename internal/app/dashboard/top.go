package dashboard

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
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The terminal's escapes that top writes: the alternate screen keeps the operator's
// scrollback as it was, and the cursor is hidden while the screen is redrawn. LeaveScreen and
// Redraw are exported for the tests that read a terminal's output.
const (
	enterScreen = "\x1b[?1049h\x1b[?25l"
	LeaveScreen = "\x1b[?25h\x1b[?1049l"
	Redraw      = "\x1b[H\x1b[2J"
)

// TopConfig is where quotaflow top reads and how it looks. The zero value is usable: the
// streams of nats.DefaultURL, a frame a second, checks counted over 10s, no warning
// transitions read back, 20 rows.
type TopConfig struct {
	NATSURL string // "" means nats.DefaultURL
	// Credentials authenticates the connection (a credentials file, "" none): the operator
	// role's, which may read both streams.
	Credentials string
	// Interval is how often the screen is redrawn; 0 means 1s.
	Interval time.Duration
	// Window is the sliding window the subjects' checks are counted over, in whole seconds;
	// 0 means 10s.
	Window time.Duration
	// Since is how far back warning transitions are read to know who is throttled now.
	Since time.Duration
	// Rows bounds the subjects and throttles listed (fewer when the terminal is shorter); 0
	// means 20.
	Rows int
}

// Validate reports the first field of c out of its range, as a *field.Error naming it.
// Unlike Top it reads a zero field as given, not as its default: it is for a command line,
// where a zero is a mistake.
func (c TopConfig) Validate() error {
	switch {
	case c.Interval < 10*time.Millisecond:
		return field.Errorf("Interval", "want at least 10ms, got %s", c.Interval)
	case c.Window < time.Second || c.Window%time.Second != 0:
		return field.Errorf("Window", "want whole seconds, at least 1s, got %s", c.Window)
	case c.Since < 0:
		return field.Errorf("Since", "want 0 or more, got %s", c.Since)
	case c.Rows < 1:
		return field.Errorf("Rows", "want at least 1, got %d", c.Rows)
	case !broker.IsURL(c.NATSURL):
		return field.Errorf("NATSURL", "want a nats:// or tls:// URL, got %q", c.NATSURL)
	}
	return nil
}

func (c TopConfig) withDefaults() TopConfig {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if c.Rows == 0 {
		c.Rows = 20
	}
	return c
}

// Top follows the decision stream and the warning transitions. On a terminal (out and in both) it redraws the board every interval until q, Ctrl-C or ctx's end, and gives the
// terminal back as it was; otherwise it prints one snapshot after the first interval, so that
// a pipe or a file gets plain text.
func Top(ctx context.Context, cfg TopConfig, out io.Writer, in *os.File) error {
	cfg = cfg.withDefaults()
	nc, js, err := connect(cfg.NATSURL, "quotaflow top", cfg.Credentials)
	if err != nil {
		return err
	}
	defer nc.Close()
	board := newTopBoard(cfg.Window)
	stop, err := followTop(ctx, js, board, cfg.Since)
	if err != nil {
		return err
	}
	defer stop()
	f, ok := out.(*os.File)
	if !ok || in == nil || !term.IsTerminal(int(f.Fd())) || !term.IsTerminal(int(in.Fd())) {
		return topSnapshot(ctx, board, cfg, out)
	}
	return topScreen(ctx, board, cfg, f, in)
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
func topSnapshot(ctx context.Context, board *topBoard, cfg TopConfig, w io.Writer) error {
	select {
	case <-ctx.Done():
	case <-time.After(cfg.Interval):
	}
	_, err := fmt.Fprintln(w, strings.Join(board.frame(time.Now(), 0, cfg.Rows, ""), "\n"))
	return err
}

// topScreen redraws the board on the terminal every interval until q, Ctrl-C or ctx's end,
// then gives the terminal back as it was: its mode, the cursor and the screen.
func topScreen(ctx context.Context, board *topBoard, cfg TopConfig, out, in *os.File) error {
	state, err := term.MakeRaw(int(in.Fd()))
	if err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	defer term.Restore(int(in.Fd()), state)
	io.WriteString(out, enterScreen)
	defer io.WriteString(out, LeaveScreen)
	quit := make(chan struct{})
	go readKeys(in, quit)
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		width, height, err := term.GetSize(int(out.Fd()))
		if err != nil {
			width, height = 0, 0
		}
		rows := cfg.Rows
		if height > 0 {
			rows = max(1, min(rows, (height-9)/2)) // the headers take 9 lines
		}
		// Raw mode sends \n as is: each line returns the carriage itself.
		if _, err := io.WriteString(out, Redraw+strings.Join(board.frame(time.Now(), width, rows, "(q quits)"), "\r\n")); err != nil {
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
