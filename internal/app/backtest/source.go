package backtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Record is one row of the decision audit, the fields a replay needs: the check, its answer,
// and its deciding limit (the audit's per-limit columns are not read: decoding them would
// cost more than the replay).
type Record struct {
	TimeUS int64
	// Subjects are the check's subjects as the audit writes them, "dimension:identifier";
	// Subject is the first one's identifier (a settle's or a lease event's subject).
	Subjects []string
	Subject  string
	Tier     string
	Endpoint string
	Cost     int64
	Allowed  bool
	Degraded bool
	Replayed bool
	// Kind is "" for a check, "reserve", "settle", "cancel", "lease_release" or
	// "lease_expired".
	Kind string
	// Rule and Limit are the deciding limit's rule and capacity (limit_value: a burst, for
	// the algorithms that have one; Rule is "" when no rule matched).
	Rule  string
	Limit int64
}

// chunkRows is about how many decisions one query reads: ClickHouse sorts a chunk in memory
// (about a GiB at most), and the replay's memory stays bounded by a few chunks' worth of
// records in flight, not by the history.
const chunkRows = 4_000_000

// recordBatch is how many records travel to the replay at once.
const recordBatch = 1024

// read streams the audit's records of [from, to) in the order Redis decided them: by time,
// and at one instant (one batch script's run) the allowed before the denied, which a replay
// of one bucket can follow exactly (a denial charges nothing, so it denies whatever allowed
// charge came before it). It reads decisions, the Distributed table on a cluster, a chunk at
// a time; the time column bounds each chunk to its days' partitions.
func read(ctx context.Context, conn driver.Conn, db string, from, to time.Time, chunk time.Duration, out chan<- []Record) error {
	defer close(out)
	for lo := from; lo.Before(to); lo = lo.Add(chunk) {
		hi := lo.Add(chunk)
		if hi.After(to) {
			hi = to
		}
		if err := readRange(ctx, conn, db, lo, hi, out); err != nil {
			return err
		}
	}
	return nil
}

func readRange(ctx context.Context, conn driver.Conn, db string, lo, hi time.Time, out chan<- []Record) error {
	// Integers only are written into the query; 18.16's time column is a DateTime, a current
	// server's a DateTime64, and both compare with toDateTime.
	q := fmt.Sprintf(`SELECT time_us, subjects, subject_id, tier, endpoint, cost, allowed, degraded, replayed, kind, rule_id, limit_value
FROM %s.decisions
WHERE %s
ORDER BY time_us, allowed DESC`, db, within(lo, hi))
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("read the audit: %w", err)
	}
	defer rows.Close()
	batch := make([]Record, 0, recordBatch)
	for rows.Next() {
		var (
			r                         Record
			allowed, degraded, replay uint8
		)
		if err := rows.Scan(&r.TimeUS, &r.Subjects, &r.Subject, &r.Tier, &r.Endpoint, &r.Cost, &allowed, &degraded, &replay, &r.Kind,
			&r.Rule, &r.Limit); err != nil {
			return fmt.Errorf("read the audit: %w", err)
		}
		r.Allowed, r.Degraded, r.Replayed = allowed == 1, degraded == 1, replay == 1
		batch = append(batch, r)
		if len(batch) == recordBatch {
			select {
			case out <- batch:
			case <-ctx.Done():
				return ctx.Err()
			}
			batch = make([]Record, 0, recordBatch)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the audit: %w", err)
	}
	if len(batch) > 0 {
		select {
		case out <- batch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// within is the condition of the decisions of [lo, hi): the time column bounds the partitions
// read, time_us the rows.
func within(lo, hi time.Time) string {
	return fmt.Sprintf("time >= toDateTime(%d) AND time <= toDateTime(%d) AND time_us >= %d AND time_us < %d",
		lo.Unix(), hi.Unix(), lo.UnixMicro(), hi.UnixMicro())
}

// chunkOf returns how much history one query of [lo, hi) reads: about chunkRows decisions, by
// a count of [lo, hi), so that ClickHouse sorts a bounded number of rows per query and scans
// the days' partitions (ordered by subject, not time) as few times as that allows.
func chunkOf(ctx context.Context, conn driver.Conn, db string, lo, hi time.Time) (time.Duration, uint64, error) {
	var n uint64
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.decisions WHERE %s", db, within(lo, hi))).Scan(&n); err != nil {
		return 0, 0, fmt.Errorf("count the audit's decisions: %w", err)
	}
	span := hi.Sub(lo)
	if n <= chunkRows {
		return span, n, nil
	}
	return max(time.Duration(float64(span)*chunkRows/float64(n)), time.Second), n, nil
}

// oldest returns the time of the audit's oldest decision, zero when it has none.
func oldest(ctx context.Context, conn driver.Conn, db string) (time.Time, error) {
	var us int64
	var n uint64
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT min(time_us), count() FROM %s.decisions", db)).Scan(&us, &n); err != nil {
		return time.Time{}, fmt.Errorf("read the audit's oldest decision: %w", err)
	}
	if n == 0 {
		return time.Time{}, nil
	}
	return time.UnixMicro(us), nil
}

// validDatabase reports whether db can be written into a query as a name.
func validDatabase(db string) bool {
	return db != "" && strings.Trim(db, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == ""
}
