// Package publisher puts the checker's decisions on NATS JetStream, off the checker's hot
// path, without losing any.
//
// Publish renders an engine's decision as the stream's event (Decision; a Client is the
// engine's checker.DecisionSink) and, like PublishDecision for a decision already rendered,
// hands it to a bounded in-memory queue and returns at once. A batcher groups
// the queued decisions per partition (see Partition) into DecisionBatch messages of at most
// Config.MaxBatch decisions, each sent on "<prefix>.<partition>" once it is full or its oldest
// decision is Config.FlushInterval old. Every message carries the Nats-Msg-Id
// "<InstanceID>.<partition>.<batch sequence>", so the stream drops a batch published twice
// within its duplicate window, and the header Quotaflow-Count with its number of decisions.
// Batch sequences count per partition from the client's start time in unix microseconds, so
// a restarted process that reuses its InstanceID never reuses an id the stream remembers.
//
// The client runs in one of two modes. In Direct mode batches go out with asynchronous
// JetStream publishes (at most Config.MaxPending awaiting acks). In Spooling mode (at start,
// until the stream is ensured; while NATS is disconnected; after a publish failed or timed
// out) batches are appended to an on-disk spool instead, and a replayer publishes the spool
// in order, under the message ids the batches were given when they were made, while NATS is
// up. When the replayer reaches the end of the spool it switches back to Direct mode under
// the same lock the batcher holds to choose where a batch goes, so no new batch overtakes a
// spooled one: the decisions of a partition keep their order across an outage. Two things
// can reorder decisions: decisions that Publish finds no room for in the queue (they go to
// the spool in overflow batches of their own, ahead of those still queued), and a batch that
// fails while a later one of the same partition, already sent, is stored.
//
// PublishDurable, what the engine calls (checker.DurableSink), takes the other path: the
// answer leaves only once its decision is in the spool file. The decisions handed over while
// one write is in progress form the next round; a single writer goroutine writes each round
// with one write(2) into the page cache (no fsync) and wakes every check of the round, so a
// busy checker shares each write among many checks. A round's decisions are written as
// fragments of their partition's open batch, whose message id the writer gives when the batch
// opens; every FlushInterval a marker record closes the open batches, and the replayer, the
// only publisher of the spool, publishes each batch whole once it reads the marker (Direct
// mode concerns the queue's path only). The boundaries of the messages are thus in the spool:
// a client that replays it after a crash makes the same messages under the same ids, the
// stream drops those it already stored, and a client opening a spool first writes a marker
// that closes what a crashed one left open. A check waits at most SpoolWait: when its round
// cannot be written (spool full, a write error: the decisions are dropped) or the write takes
// longer, it is answered anyway and counted in Stats.Unspooled; with NoSpoolWait,
// PublishDurable is Publish.
//
// The two paths stay two (the flag --spool-wait 0 sets NoSpoolWait, which takes the queue's
// path): each guarantees what the other cannot, and serving both with one would give one of
// them up.
//
//   - The queue's path needs no disk while NATS is up: in Direct mode a batch goes from memory
//     to JetStream, and the spool is written only in Spooling mode (which a failed publish
//     starts) and for overflow batches. While NATS takes the batches and the queue has room,
//     a full, failing or slow spool loses and delays nothing. PublishDurable's path writes every decision to the spool
//     before it can reach NATS: a round the spool cannot take is dropped even with NATS up,
//     so are the decisions past QueueSize when the disk falls behind, and every decision is
//     written and read back by the replayer. --spool-wait 0 chooses the former, and
//     TestPublishDurableNoWait holds it to that: published directly, none spooled.
//   - PublishDurable's path makes an answered decision survive a kill -9; the queue's path
//     holds its decisions in memory (queue, batches, unacked publishes) until the stream acks
//     them. For that the durable batches' boundaries are in the spool (fragments under an id
//     given when the batch opens, closed by a marker), so that a replay after a crash makes
//     the same messages under the same ids; and the replayer is their only publisher. Were
//     they also sent from memory in Direct mode, the cursor, which moves only past what the
//     replayer saw acked, would leave them to be sent again after a crash: a duplicate the
//     stream drops only within its DuplicateWindow.
//
// Both keep every decision exactly once in the stream, the same way: a batch's message id is
// fixed before its first publish and every retry or replay sends it under that id. The paths
// share the per-partition batch sequences (msgID), so their ids never meet, and the spool and
// its replayer, which publishes whole records (the queue's) and closed fragment batches (the
// durable path's) in spool order.
//
// The spool is a folder of append-only segment files (00000000000000000001.seg, ...) of
// records [uint32 length][uint32 CRC-32C][payload], the payload being the partition, the
// message id and the number of decisions (uvarints, the id length-prefixed) followed by the
// DecisionBatch bytes, all little-endian; the partition of a fragment has bit 24 set, and a
// marker is a fragment without id or decisions. A cursor file (segment, offset) written
// atomically (temporary file and rename) says where the unpublished records begin. The
// queue's writes are buffered and handed to the OS every FlushInterval, segments are fsynced when they are full and on
// Close. At open the spool is scanned, a torn record at the end (a crash in mid-write) is cut
// off, and a non-empty spool is replayed. Only when the spool holds Config.SpoolMaxBytes is a
// decision dropped: counted in Stats.Dropped and logged at most once a second.
//
// A kill -9 of the process loses no decision PublishDurable returned for (unless counted in
// Unspooled): it is in the page cache, which the next client on the spool reads. An OS crash
// or a power loss can lose what the OS had not yet written to the disk: segments are fsynced
// when they are full and on Close, not per write.
//
// On the queue's path (Publish, PublishDecision, and PublishDurable with NoSpoolWait), what a
// kill -9 of the process can lose is what is only in its memory: the queue (taken by
// the batcher every FlushInterval/4, between 1ms and 10ms), the partial batches (at most
// FlushInterval old), the overflow batches and buffered spool writes (handed to the OS every
// FlushInterval), and the batches sent but not yet stored by JetStream (about one round
// trip). With a batcher that keeps up that is about FlushInterval plus a millisecond or two
// of decisions; the hard bound is QueueSize + 2*Partitions*MaxBatch + MaxPending*MaxBatch
// decisions plus FlushInterval of spool writes. An OS crash can also lose the spool writes
// not yet fsynced (segments are fsynced when full and on Close).
//
// The NATS connection should reconnect forever and not buffer while disconnected
// (nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1)): the
// spool is the buffer, and a client-side reconnect buffer would let a later batch reach the
// stream before an earlier one that failed.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaflow/quotaflow/internal/instance"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The defaults of Config's fields.
const (
	defaultReplicas        = 1
	defaultMaxAge          = 72 * time.Hour
	defaultDuplicateWindow = 2 * time.Minute
	defaultMaxBatch        = 512
	defaultFlushInterval   = 5 * time.Millisecond
	defaultQueueSize       = 65536
	defaultMaxPending      = 256
	defaultAckTimeout      = 5 * time.Second
	defaultSpoolDir        = "quotaflow-spool"
	defaultSpoolMaxBytes   = 1 << 30
	defaultSegmentBytes    = 64 << 20
	defaultSpoolWait       = 100 * time.Millisecond
)

// Config configures a Client; the zero value is usable (defaults below). A zero or negative
// number or duration means its default.
type Config struct {
	// Stream is the JetStream stream's name ("QUOTAFLOW_DECISIONS").
	Stream string
	// SubjectPrefix names the subjects: messages go to <prefix>.<partition>, the stream takes
	// <prefix>.> ("quotaflow.decisions").
	SubjectPrefix string
	// Partitions is the number of partition subjects (16). Every checker must use the same.
	Partitions int
	// Replicas is the stream's replica count (1).
	Replicas int
	// MaxAge is how long the stream keeps decisions, the buffer for a downstream outage (72h).
	MaxAge time.Duration
	// DuplicateWindow is how long the stream remembers message ids (2m, capped at MaxAge): long
	// enough to drop a batch re-sent after a lost ack; each id held costs the server ~100 bytes.
	DuplicateWindow time.Duration
	// MaxBatch is the most decisions in one message (512).
	MaxBatch int
	// FlushInterval is the longest a partial batch waits, how often the spool's buffered
	// writes are handed to the OS, and how often the batches of PublishDurable's fragments
	// are closed (5ms).
	FlushInterval time.Duration
	// QueueSize is how many decisions the in-memory queue holds (65536).
	QueueSize int
	// MaxPending is the most asynchronous publishes awaiting acks (256).
	MaxPending int
	// AckTimeout is how long a publish may wait for its ack before it counts as failed (5s).
	AckTimeout time.Duration
	// SpoolDir is the spool's folder, created if missing ("quotaflow-spool"). One client at a
	// time may use it.
	SpoolDir string
	// SpoolMaxBytes bounds the spool's size on disk (1 GiB).
	SpoolMaxBytes int64
	// SegmentBytes is the size at which the spool starts a new segment file (64 MiB), at
	// most an eighth of SpoolMaxBytes (but 64 KiB): PublishDurable writes every decision to
	// the spool, and a segment's published records take room until it is removed as a whole.
	SegmentBytes int64
	// SpoolWait is the longest PublishDurable holds a check for the write of its decision to
	// the spool (100ms): past it the check is answered anyway, counted in Stats.Unspooled, and
	// its decision is written when the disk lets it.
	SpoolWait time.Duration
	// NoSpoolWait makes PublishDurable return at once, as Publish does: decisions wait for
	// their batch in memory, and a kill -9 loses those of about the last FlushInterval.
	NoSpoolWait bool
	// InstanceID names this client in message ids (default: 12 random hex characters). It
	// must not contain '.', '*', '>' or white space.
	InstanceID string
	// Meter receives the client's counters (Stats) as metrics (none when nil).
	Meter metric.Meter
	// Logger receives the client's logs, with "component"="publisher" (slog.Default()).
	Logger *slog.Logger
}

// withDefaults returns cfg with every unset field at its default.
func (cfg Config) withDefaults() Config {
	if cfg.Stream == "" {
		cfg.Stream = stream.Name
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = stream.SubjectPrefix
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = stream.Partitions
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = defaultReplicas
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = defaultMaxAge
	}
	if cfg.DuplicateWindow <= 0 {
		cfg.DuplicateWindow = defaultDuplicateWindow
	}
	cfg.DuplicateWindow = min(cfg.DuplicateWindow, cfg.MaxAge)
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = defaultMaxBatch
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = defaultFlushInterval
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = defaultQueueSize
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = defaultMaxPending
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = defaultAckTimeout
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = defaultSpoolDir
	}
	if cfg.SpoolMaxBytes <= 0 {
		cfg.SpoolMaxBytes = defaultSpoolMaxBytes
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = defaultSegmentBytes
	}
	cfg.SegmentBytes = min(cfg.SegmentBytes, max(cfg.SpoolMaxBytes/8, 64<<10))
	if cfg.SpoolWait <= 0 {
		cfg.SpoolWait = defaultSpoolWait
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// validate reports a configuration the stream or the message ids cannot work with.
// Validate reports the first field of cfg outside its range, as a *field.Error naming it (a
// message naming another field names it as the field it is: MaxAge). Unlike New, it reads a
// zero field as given rather than as its default: it is for callers that set every field,
// such as a command line, where a zero is a mistake and not "the default". SpoolWait 0 is
// given as no wait (NoSpoolWait).
func (cfg Config) Validate() error {
	switch {
	case cfg.Partitions < 1 || cfg.Partitions > stream.MaxPartitions:
		return field.Errorf("Partitions", "want 1 to %d, got %d", stream.MaxPartitions, cfg.Partitions)
	case cfg.Replicas < 1 || cfg.Replicas > 5:
		return field.Errorf("Replicas", "want 1 to 5, got %d", cfg.Replicas)
	case cfg.DuplicateWindow <= 0 || cfg.DuplicateWindow > cfg.MaxAge:
		return field.Errorf("DuplicateWindow", "want more than 0 and at most MaxAge (%s), got %s", cfg.MaxAge, cfg.DuplicateWindow)
	case cfg.MaxBatch < 1:
		return field.Errorf("MaxBatch", "want at least 1, got %d", cfg.MaxBatch)
	case cfg.FlushInterval < time.Millisecond:
		return field.Errorf("FlushInterval", "want at least 1ms, got %s", cfg.FlushInterval)
	case cfg.SpoolMaxBytes < 1<<20:
		return field.Errorf("SpoolMaxBytes", "want at least 1 MiB, got %d", cfg.SpoolMaxBytes)
	case cfg.SpoolWait < 0:
		return field.Errorf("SpoolWait", "want 0 (no wait) or more, got %s", cfg.SpoolWait)
	}
	return nil
}

func (cfg Config) validate() error {
	switch {
	case cfg.Stream == "" || strings.ContainsAny(cfg.Stream, ".*> \t\r\n"):
		return fmt.Errorf("stream name %q: want a name without '.', '*', '>' or white space", cfg.Stream)
	case !validSubjectPrefix(cfg.SubjectPrefix):
		return fmt.Errorf("subject prefix %q: want literal dot-separated tokens", cfg.SubjectPrefix)
	case strings.ContainsAny(cfg.InstanceID, ".*> \t\r\n"):
		return fmt.Errorf("instance id %q: want an id without '.', '*', '>' or white space", cfg.InstanceID)
	}
	return nil
}

func validSubjectPrefix(p string) bool {
	if p == "" || strings.ContainsAny(p, "*> \t\r\n") {
		return false
	}
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}

// Stats are the client's counters. Published, Spooled, Replayed and Dropped count decisions
// since New; the others are current values.
type Stats struct {
	// Queued is the number of decisions in memory: queued, in a partial batch, in an
	// overflow batch not yet written to the spool, or waiting for PublishDurable's write.
	Queued int64
	// Published is the number of decisions acked by the stream when first sent: directly, or
	// through the spool by PublishDurable.
	Published int64
	// Spooled is the number of decisions written to the spool.
	Spooled int64
	// Replayed is the number of decisions acked by the stream when sent again from the spool,
	// where the direct path put them when NATS could not take them. Published + Replayed is
	// what reached the stream.
	Replayed int64
	// Dropped is the number of decisions lost: the spool was full or could not be written, a
	// decision could not be encoded or its batch exceeds the server's max payload, or Publish
	// was called after Close.
	Dropped int64
	// Unspooled is the number of checks PublishDurable let go before their decision was in
	// the spool: its write failed (the decision is in Dropped too) or took longer than
	// SpoolWait. A kill -9 could lose those answered decisions.
	Unspooled int64
	// SpoolBytes is the size of the spool's records not yet published.
	SpoolBytes int64
	// Pending is the number of decisions in messages awaiting acks.
	Pending int64
}

// EnsureStream creates the decision stream, or updates it to cfg: file storage, limits
// retention, subjects <prefix>.>, cfg.MaxAge, cfg.DuplicateWindow (capped at MaxAge) and
// cfg.Replicas, defaults applied as in New.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg = cfg.withDefaults()
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "quotaflow rate-limit decisions, DecisionBatch messages per partition",
		Subjects:    []string{cfg.SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

// mode says where the batcher sends a batch.
type mode uint8

const (
	modeSpooling mode = iota // to the spool, which the replayer publishes
	modeDirect               // to JetStream
)

// Client publishes decisions, on the queue's path (Publish, PublishDecision) or the durable
// path (PublishDurable); the package doc says why these are two. Its methods are safe for
// concurrent use.
type Client struct {
	cfg      Config
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream // direct publishes and stream management
	jsReplay jetstream.JetStream // replayer publishes, with their own pending window
	spool    *spool
	subjects []string  // subject per partition
	seqs     []seqSlot // next batch sequence per partition
	overflow []overflowSlot

	queue   chan *quotaflowv1.Decision
	closing atomic.Bool
	batched atomic.Int64 // decisions in partial batches
	// overflowed counts the decisions in overflow batches, not yet in the spool.
	overflowed atomic.Int64
	bufs       chan []byte // free batch buffers
	watchCh    chan watchItem
	replayCh   chan struct{} // wakes the replayer
	ensureCh   chan struct{} // wakes the stream ensurer

	// modeMu orders the batcher's choice of Direct or Spooling with the ack watcher's and the
	// replayer's changes of mode; cond signals changes of inflight and aborted.
	modeMu   sync.Mutex
	cond     *sync.Cond
	mode     mode
	inflight int  // direct batches awaiting acks
	aborted  bool // Close's ctx is done: everything goes to the spool

	streamReady atomic.Bool

	// PublishDurable's group commit: commitMu guards round, the decisions waiting for the next
	// write; writeMu makes one writer at a time (the writer goroutine, the maintenance loop's
	// markers, Close) and guards records, the buffer a round's records are encoded into, and
	// frags, the open batch per partition that the rounds' fragments join.
	commitMu   sync.Mutex
	round      *round
	committing atomic.Int64 // decisions in rounds not yet written
	commitCh   chan struct{}
	expiry     *time.Timer           // runs expire when a write takes SpoolWait
	writing    atomic.Pointer[round] // the round being written
	writes     atomic.Int64          // rounds written, for the benchmarks' decisions per write
	writeMu    sync.Mutex
	records    []byte
	frags      []openBatch
	fragsOpen  int // partitions with an open batch
	unspooled  atomic.Int64

	published atomic.Int64
	spooled   atomic.Int64
	replayed  atomic.Int64
	dropped   atomic.Int64
	pending   atomic.Int64
	dropWhy   atomic.Pointer[string]
	// dropLogged and dropLoggedAt are maintainLoop's (then Close's): the last drop log.
	dropLogged   int64
	dropLoggedAt time.Time

	stopBatch chan struct{} // Close: the batcher drains the queue and exits
	batchDone chan struct{}
	abort     chan struct{} // Close's ctx is done
	stop      chan struct{} // Close: the other goroutines exit
	abortOnce sync.Once
	closeOnce sync.Once
	closeErr  error
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// seqSlot is a batch sequence counter padded to its own cache line.
type seqSlot struct {
	n atomic.Uint64
	_ [56]byte
}

// New opens (creating) the spool folder, starts the client's goroutines and returns. It
// succeeds while NATS is down: the stream is ensured in the background, and until then every
// batch goes to the spool.
func New(nc *nats.Conn, cfg Config) (*Client, error) {
	if nc == nil {
		return nil, errors.New("publisher: nil nats connection")
	}
	cfg = cfg.withDefaults()
	if cfg.InstanceID == "" {
		cfg.InstanceID = instance.NewID()
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	c, err := makeClient(nc, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Meter != nil {
		if err := c.observe(cfg.Meter); err != nil {
			return nil, fmt.Errorf("publisher: metrics: %w", err)
		}
	}
	if err := c.openSpool(); err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(6)
	go c.batchLoop()
	go c.commitLoop()
	go c.watchLoop()
	go c.replayLoop()
	go c.ensureLoop()
	go c.maintainLoop()
	return c, nil
}

// makeClient makes a client of cfg on nc, its goroutines not started, its spool not open.
func makeClient(nc *nats.Conn, cfg Config) (*Client, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout), jetstream.WithDefaultTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("publisher: jetstream: %w", err)
	}
	jsReplay, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("publisher: jetstream: %w", err)
	}
	c := &Client{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "publisher"),
		nc:        nc,
		js:        js,
		jsReplay:  jsReplay,
		subjects:  make([]string, cfg.Partitions),
		seqs:      make([]seqSlot, cfg.Partitions),
		overflow:  make([]overflowSlot, cfg.Partitions),
		frags:     make([]openBatch, cfg.Partitions),
		queue:     make(chan *quotaflowv1.Decision, cfg.QueueSize),
		bufs:      make(chan []byte, cfg.MaxPending+cfg.Partitions),
		watchCh:   make(chan watchItem, cfg.MaxPending),
		replayCh:  make(chan struct{}, 1),
		ensureCh:  make(chan struct{}, 1),
		commitCh:  make(chan struct{}, 1),
		stopBatch: make(chan struct{}),
		batchDone: make(chan struct{}),
		abort:     make(chan struct{}),
		stop:      make(chan struct{}),
	}
	c.cond = sync.NewCond(&c.modeMu)
	c.expiry = time.AfterFunc(time.Hour, c.expire)
	c.expiry.Stop()
	for p := range c.subjects {
		c.subjects[p] = stream.Subject(cfg.SubjectPrefix, p)
	}
	// Batch sequences start at the start time in microseconds, not 1: a process restarted
	// with the same InstanceID must not reuse a message id the stream still remembers (it
	// would drop the new batch as a duplicate). Each partition makes far fewer than a batch
	// per microsecond, so the ranges of two runs never meet.
	start := uint64(time.Now().UnixMicro())
	for p := range c.seqs {
		c.seqs[p].n.Store(start)
	}
	return c, nil
}

// openSpool opens (creating) the spool folder and, when it holds decisions a previous client
// left, closes the batches that client left open.
func (c *Client) openSpool() error {
	var err error
	c.spool, err = openSpool(c.cfg.SpoolDir, c.cfg.SpoolMaxBytes, c.cfg.SegmentBytes, c.log, c.drop)
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	if n := c.spool.pendingBytes(); n > 0 {
		c.log.Info("spool holds unpublished decisions, replaying", "spool_dir", c.cfg.SpoolDir, "bytes", n)
		// The batches a crashed client left open are whole now: no fragment joins them.
		if err := c.spool.mark(); err != nil {
			c.spool.close()
			return fmt.Errorf("publisher: %w", err)
		}
	}
	return nil
}

// PublishDecision hands d to the client, which owns it from now on, and returns at once. When
// the queue is full, d is appended to the spool; when the spool is full too, d is dropped
// (Stats.Dropped).
func (c *Client) PublishDecision(d *quotaflowv1.Decision) {
	if d == nil {
		return
	}
	if c.closing.Load() {
		c.drop(1, "publish after close")
		return
	}
	select {
	case c.queue <- d:
	default:
		c.spoolOne(d)
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Queued:     int64(len(c.queue)) + c.batched.Load() + c.overflowed.Load() + c.committing.Load(),
		Published:  c.published.Load(),
		Spooled:    c.spooled.Load(),
		Replayed:   c.replayed.Load(),
		Dropped:    c.dropped.Load(),
		Unspooled:  c.unspooled.Load(),
		SpoolBytes: c.spool.pendingBytes(),
		Pending:    c.pending.Load(),
	}
}

// Close is the SIGTERM path: it stops accepting decisions, flushes the partial batches,
// publishes the queue and drains the spool until it is empty or ctx is done. What is left
// stays in the spool, fsynced, for the next client on the same folder; Close then returns an
// error saying so. Publish and PublishDecision must not be called during or after Close (such decisions are
// dropped). Close waits for NATS as long as ctx allows: give it a deadline.
func (c *Client) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { c.closeErr = c.close(ctx) })
	return c.closeErr
}

func (c *Client) close(ctx context.Context) error {
	c.closing.Store(true)
	close(c.stopBatch)
	select {
	case <-c.batchDone:
	case <-ctx.Done():
		c.doAbort()
		<-c.batchDone
	}
	c.writeRound() // what PublishDurable handed over before closing
	c.closeBatches()
	tick := time.NewTicker(c.cfg.FlushInterval)
	defer tick.Stop()
drain:
	for !c.drained() {
		c.kick(c.replayCh)
		select {
		case <-tick.C:
		case <-ctx.Done():
			c.doAbort()
			break drain
		}
	}
	// After an abort the watcher spools what still awaits an ack: wait for it.
	c.modeMu.Lock()
	for c.inflight > 0 {
		c.cond.Wait()
	}
	c.modeMu.Unlock()
	close(c.stop)
	c.cancel()
	c.wg.Wait()
	// Decisions of Publish calls that raced with Close.
	for {
		select {
		case d := <-c.queue:
			c.spoolOne(d)
			continue
		default:
		}
		break
	}
	c.spoolOverflows()
	c.writeRound()
	c.closeBatches()
	left := c.spool.pendingBytes()
	if err := c.spool.close(); err != nil {
		return fmt.Errorf("publisher: close spool: %w", err)
	}
	c.logDrops(true)
	st := c.Stats()
	c.log.Info("publisher closed", "published", st.Published, "spooled", st.Spooled, "replayed", st.Replayed,
		"dropped", st.Dropped, "spool_bytes_left", st.SpoolBytes)
	if left > 0 {
		return fmt.Errorf("publisher: spool not drained, %d bytes left in %s: %w", left, c.cfg.SpoolDir, context.Cause(ctx))
	}
	return nil
}

// drained reports whether everything handed to the client reached the stream.
func (c *Client) drained() bool {
	c.modeMu.Lock()
	inflight := c.inflight
	c.modeMu.Unlock()
	return inflight == 0 && len(c.queue) == 0 && c.overflowed.Load() == 0 && c.committing.Load() == 0 && c.spool.empty()
}

// doAbort makes every remaining batch go to the spool, and stops waiting for acks.
func (c *Client) doAbort() {
	c.abortOnce.Do(func() {
		close(c.abort)
		c.modeMu.Lock()
		c.aborted = true
		c.cond.Broadcast()
		c.modeMu.Unlock()
	})
}

// kick wakes the goroutine that waits on ch, without blocking.
func (c *Client) kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// drop counts n lost decisions; the maintenance loop logs them.
func (c *Client) drop(n int64, why string) {
	c.dropWhy.Store(&why)
	c.dropped.Add(n)
}
