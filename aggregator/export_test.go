package aggregator

import (
	"context"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// InsertGone is insertGone of an aggregator on ch with the given insert timeout.
func InsertGone(ctx context.Context, ch driver.Conn, timeout time.Duration, id string) error {
	return (&Aggregator{ch: ch, cfg: Config{InsertTimeout: timeout}}).insertGone(ctx, id)
}

// StoredSeqs and StoredDecisions are the two lookups of a recheck, of an aggregator on ch and
// database db: the messages ingested_messages holds, and those whose decisions the decisions
// table holds within the span first..last (unix µs).
func StoredSeqs(ctx context.Context, ch driver.Conn, db string, p int, lo, hi uint64) (map[uint64]bool, error) {
	return (&Aggregator{ch: ch, cfg: Config{Database: db, InsertTimeout: 10 * time.Second}}).storedSeqs(ctx, p, lo, hi)
}

func StoredDecisions(ctx context.Context, ch driver.Conn, db string, p int, lo, hi uint64, first, last int64) (map[uint64]bool, error) {
	a := &Aggregator{ch: ch, cfg: Config{Database: db, InsertTimeout: 10 * time.Second}}
	return a.storedDecisions(ctx, p, &partPending{lo: lo, hi: hi, first: first, last: last})
}
