// Package backtest answers "what would these rules have done?": it replays the checks of the
// decision audit in ClickHouse, in the order Redis decided them, through a rule set with the
// in-process twins of the bucket scripts (checker.Replay), and reports where the would-be
// decisions differ from the recorded ones: per rule and tier, per subject, per hour, and per
// reason. Replaying the rules that decided reproduces the recorded decisions of every
// deterministic algorithm; each difference that remains is explained (a fail mode's answer, an
// override, a lease, a reservation settled).
package backtest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/schema"
)

// Config configures a Backtester. Conn is required; the rest has defaults.
type Config struct {
	// Conn reads the audit; Database is its database (schema.DefaultDatabase when empty). On
	// a replicated layout, decisions is the Distributed table, so one server reads them all.
	Conn     driver.Conn
	Database string
	// MaxBuckets bounds the buckets a replay holds at once (0: 4M); the expired go first.
	MaxBuckets int
	// MaxRules bounds the rules one backtest replays (0: none), MaxRecords the audit rows it
	// reads, its warm-up's included (0: none): past either, Run refuses the request with a
	// *field.Error naming rules or from before reading anything. MaxPlanBytes bounds the cache
	// of planned checks (0: 256 MiB). Together with MaxBuckets they bound a backtest's memory;
	// the admin API's, which run inside a checker, are small (docs/backtest.md).
	MaxRules     int
	MaxRecords   int64
	MaxPlanBytes int64
	// Logger receives each backtest's summary, with "component"="backtest"; nil: slog.Default().
	Logger *slog.Logger
}

// Request is one backtest.
type Request struct {
	// Rules are the rules to replay the history under.
	Rules *rules.Set
	// From and To bound the reported history, [From, To). The checks of the warm-up before
	// From are replayed too, unreported, so that buckets enter From as Redis had them.
	From, To time.Time
	// Warmup is how much history before From is replayed unreported; 0 means the longest
	// window of Rules, at most a day; negative means none.
	Warmup time.Duration
	// Subject ("user:alice", as the audit writes subjects), Tier and Rule restrict what is
	// reported; every check is replayed all the same, since buckets (a global rule's, an
	// org's) are shared between subjects and tiers.
	Subject, Tier, Rule string
	// Top is how many subjects the report lists (0: 10; at most 1000).
	Top int
	// Progress, when set, is called after each batch of records with the replay so far.
	Progress func(Progress)
}

// Progress is how far a backtest got.
type Progress struct {
	// At is the time of the last record replayed.
	At       time.Time
	From, To time.Time
	// Records is how many audit rows were read.
	Records int64
	Elapsed time.Duration
}

// Fraction is the share of [From, To) replayed (the warm-up counting as before From).
func (p Progress) Fraction() float64 {
	span := p.To.Sub(p.From)
	if span <= 0 {
		return 1
	}
	return min(max(float64(p.At.Sub(p.From))/float64(span), 0), 1)
}

// maxTop bounds Request.Top: the subjects are counted in memory, ten times as many as listed.
const maxTop = 1000

// maxWarmup bounds the default warm-up: a day of history per backtest at most.
const maxWarmup = 24 * time.Hour

// defaultMaxBuckets is Config.MaxBuckets's default: a few hundred bytes each.
const defaultMaxBuckets = 4 << 20

// defaultMaxPlanBytes is Config.MaxPlanBytes's default.
const defaultMaxPlanBytes = 256 << 20

// InChecker is the bounds of a backtest run inside a checker, by its admin API (POST
// /api/v1/rules:backtest): a read token must not take the checker's memory. Larger backtests
// run in a process of their own, `quotaflow backtest`, whose bounds are the defaults. Measured
// at these bounds: docs/backtest.md.
var InChecker = Config{MaxRules: 100, MaxRecords: 500_000, MaxBuckets: 1 << 18, MaxPlanBytes: 32 << 20}

// Backtester runs backtests over one audit. Its methods are safe for concurrent use.
type Backtester struct {
	cfg Config
	log *slog.Logger
}

// New returns a Backtester for cfg.
func New(cfg Config) *Backtester {
	if cfg.Database == "" {
		cfg.Database = schema.DefaultDatabase
	}
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = defaultMaxBuckets
	}
	if cfg.MaxPlanBytes <= 0 {
		cfg.MaxPlanBytes = defaultMaxPlanBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Backtester{cfg: cfg, log: log.With("component", "backtest")}
}

// Run replays the history req names and reports it. Its errors are a *field.Error for a request
// that cannot be run (no rules, an empty or future window, a window outside the audit's
// retention, a rule the rules do not have), the context's, or reading the audit's.
func (b *Backtester) Run(ctx context.Context, req Request) (*Report, error) {
	now := time.Now()
	if err := validate(&req, now); err != nil {
		return nil, err
	}
	if n := len(req.Rules.Rules()); b.cfg.MaxRules > 0 && n > b.cfg.MaxRules {
		return nil, field.Errorf("rules", "%d rules; a backtest here replays at most %d (quotaflow backtest runs larger ones in a process of its own)", n, b.cfg.MaxRules)
	}
	if !validDatabase(b.cfg.Database) {
		return nil, fmt.Errorf("backtest: database %q is no plain name", b.cfg.Database)
	}
	if req.To.After(now) {
		req.To = now
	}
	start := req.From.Add(-warmup(req))
	if first, err := oldest(ctx, b.cfg.Conn, b.cfg.Database); err != nil {
		return nil, err
	} else if !first.IsZero() && start.Before(first) {
		start = first
	}
	chunk, rows, err := chunkOf(ctx, b.cfg.Conn, b.cfg.Database, start, req.To)
	if err != nil {
		return nil, err
	}
	if b.cfg.MaxRecords > 0 && int64(rows) > b.cfg.MaxRecords {
		return nil, field.Errorf("from", "the window and its warm-up hold %d audit rows; a backtest here reads at most %d: narrow from and to (quotaflow backtest runs larger ones in a process of its own)", rows, b.cfg.MaxRecords)
	}
	began := time.Now()
	rep := newReport(req)
	rep.maxPlanBytes = b.cfg.MaxPlanBytes
	replay := checker.NewReplay(req.Rules, b.cfg.MaxBuckets)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []Record, 64) // lets the reader run a chunk ahead: ClickHouse sorts the next while the replay runs
	readErr := make(chan error, 1)
	go func() { readErr <- read(ctx, b.cfg.Conn, b.cfg.Database, start, req.To, chunk, batches) }()
	for batch := range batches {
		for i := range batch {
			rep.replay(replay, &batch[i])
		}
		if req.Progress != nil {
			req.Progress(Progress{At: time.UnixMicro(batch[len(batch)-1].TimeUS), From: req.From, To: req.To,
				Records: rep.Records, Elapsed: time.Since(began)})
		}
	}
	if err := <-readErr; err != nil {
		return nil, err
	}
	rep.finish(time.Since(began))
	b.log.Info("backtest done", "from", req.From, "to", req.To, "records", rep.Records, "checks", rep.Checks,
		"agreement", rep.Agreement, "elapsed", rep.Elapsed)
	return rep, nil
}

// validate checks req against the audit's retention at now.
func validate(req *Request, now time.Time) error {
	if req.Rules == nil {
		return field.Errorf("rules", "none given")
	}
	if err := validateWindow(req, now); err != nil {
		return err
	}
	return validateFilters(req)
}

// validateWindow checks req's From and To against the audit's retention at now, and its Top;
// a zero To is now.
func validateWindow(req *Request, now time.Time) error {
	if req.From.IsZero() {
		return field.Errorf("from", "required")
	}
	if req.To.IsZero() {
		req.To = now
	}
	if !req.From.Before(req.To) {
		return field.Errorf("to", "%s is not after from (%s)", req.To.Format(time.RFC3339), req.From.Format(time.RFC3339))
	}
	if req.From.After(now) {
		return field.Errorf("from", "%s is in the future", req.From.Format(time.RFC3339))
	}
	if days := schema.Retention(schema.Decisions).Days; req.From.Before(now.AddDate(0, 0, -days)) {
		return field.Errorf("from", "%s is outside the audit's retained history (%d days)", req.From.Format(time.RFC3339), days)
	}
	if req.Top < 0 || req.Top > maxTop {
		return field.Errorf("top", "%d is not 0 to %d", req.Top, maxTop)
	}
	return nil
}

// validateFilters checks req's rule and tier against its Rules, and its subject.
func validateFilters(req *Request) error {
	if req.Rule != "" {
		if _, ok := req.Rules.Rule(req.Rule); !ok {
			return field.Errorf("rule", "no rule %q in the rules given", req.Rule)
		}
	}
	if req.Tier != "" && !req.Rules.HasTier(req.Tier) {
		return field.Errorf("tier", "no tier %q in the rules given", req.Tier)
	}
	return validateSubject(req.Subject)
}

// validateSubject checks a subject filter: empty, or a subject as the audit writes them.
func validateSubject(subject string) error {
	if subject == "" {
		return nil
	}
	if _, err := parseSubject(subject); err != nil {
		return field.Errorf("subject", "%v", err)
	}
	return nil
}

// warmup is how much history before From req replays (Request.Warmup).
func warmup(req Request) time.Duration {
	switch {
	case req.Warmup < 0:
		return 0
	case req.Warmup > 0:
		return req.Warmup
	}
	var w time.Duration
	for _, r := range req.Rules.Rules() {
		w = max(w, r.Window)
	}
	return min(w, maxWarmup)
}
