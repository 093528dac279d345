// Package audit answers the console's questions from what the aggregators recorded in
// ClickHouse: allowed and denied checks per tier or rule over a span (the usage rollups), the
// subjects throttled most, a subject's usage over a billing period and its recent decisions
// (the decision audit). Fail-mode answers (Redis unreachable) are counted apart everywhere, so
// that an outage never reads as throttling. Every query runs on ClickHouse 18.16 and current.
package audit

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/schema"
)

// Config configures a Reader. Conn is required.
type Config struct {
	// Conn reads the audit and the rollups; Database is their database (schema.DefaultDatabase
	// when empty). On a replicated layout the tables read are the Distributed ones.
	Conn     driver.Conn
	Database string
}

// Reader runs the queries. Its methods are safe for concurrent use.
type Reader struct {
	conn driver.Conn
	db   string
}

// New returns a Reader for cfg, or an error when cfg.Database is no plain name (it is written
// into the queries).
func New(cfg Config) (*Reader, error) {
	if cfg.Database == "" {
		cfg.Database = schema.DefaultDatabase
	}
	if !plainName.MatchString(cfg.Database) {
		return nil, fmt.Errorf("audit: database %q is no plain name", cfg.Database)
	}
	return &Reader{conn: cfg.Conn, db: cfg.Database}, nil
}

var plainName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Ping reports whether ClickHouse answers.
func (r *Reader) Ping(ctx context.Context) error {
	if err := r.conn.Ping(ctx); err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	return nil
}

// Counts are checks by outcome. Denied counts only the limits' denials; Degraded the answers a
// fail mode gave (allowed or denied), DegradedDenied those of them that denied.
type Counts struct {
	Checks         int64 `json:"checks"`
	Allowed        int64 `json:"allowed"`
	Denied         int64 `json:"denied"`
	Delayed        int64 `json:"delayed"`
	Degraded       int64 `json:"degraded"`
	DegradedDenied int64 `json:"degraded_denied"`
}

// subjectDimensions are the dimensions the audit writes subjects with (dimension:identifier).
var subjectDimensions = []string{"user", "ip", "api_key", "descriptor", "global"}

// validSubject checks a subject as the audit writes them: dimension:identifier.
func validSubject(s string) error {
	dim, id, ok := strings.Cut(s, ":")
	switch {
	case !ok || id == "":
		return fmt.Errorf("%q: want dimension:identifier (user:alice)", s)
	case len(s) > 512:
		return fmt.Errorf("%q: longer than 512 bytes", s[:32]+"…")
	}
	for _, d := range subjectDimensions {
		if d == dim {
			return nil
		}
	}
	return fmt.Errorf("%q: unknown dimension %q (want %s)", s, dim, strings.Join(subjectDimensions, ", "))
}

// checks is the audit's filter of the rows that are checks (not settles, cancels or lease
// events, which charged no check of their own).
const checks = "(kind = '' OR kind = 'reserve') AND replayed = 0"

// outcomes are the audit's Counts columns, in Counts's order.
const outcomes = `count() AS checks, sum(allowed) AS allowed_n, countIf(allowed = 0 AND degraded = 0) AS denied_n,
    countIf(allowed = 1 AND delay_us > 0) AS delayed_n, sum(degraded) AS degraded_n, countIf(allowed = 0 AND degraded = 1) AS degraded_denied_n`

// timeBound filters the audit on [from, to) by its partition key's column first.
func timeBound(from, to time.Time) string {
	return fmt.Sprintf("time >= toDateTime(%d) AND time < toDateTime(%d) AND time_us >= %d AND time_us < %d",
		from.Unix(), to.Unix()+1, from.UnixMicro(), to.UnixMicro())
}
