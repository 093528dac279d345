package backtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Record is one row of the decision audit, the fields a replay needs.
type Record struct {
	ID     string
	TimeUS int64
	// Subjects are the check's subjects as the audit writes them, "dimension:identifier".
	Subjects []string
	Tier     string
	Endpoint string
	Cost     int64
	Allowed  bool
	Degraded bool
	Replayed bool
	// Kind is "" for a check, "reserve", "settle", "cancel", "lease_release" or
	// "lease_expired".
	Kind   string
	Limits []RecordedLimit
}

// RecordedLimit is one limit a recorded decision evaluated.
type RecordedLimit struct {
	Rule       string
	Identifier string
	Limit      int64
	Allowed    bool
	Shadow     bool
}

// readChunk is how much history one query reads: ClickHouse sorts a chunk in memory, so the
// replay's memory and the server's stay bounded by a chunk's rows, not the history's.
const readChunk = time.Minute

// recordBatch is how many records travel to the replay at once.
const recordBatch = 1024

// read streams the audit's records of [from, to) in the order Redis decided them: by time,
// and at one instant (one batch script's run) the allowed before the denied, which a replay
// of one bucket can follow exactly (a denial charges nothing, so it denies whatever allowed
// charge came before it). It reads decisions, the Distributed table on a cluster, a chunk at
// a time; the time column bounds each chunk to its days' partitions.
func read(ctx context.Context, conn driver.Conn, db string, from, to time.Time, chunk time.Duration, out chan<- []Record) error {
	defer close(out)
	if chunk <= 0 {
		chunk = readChunk
	}
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
	q := fmt.Sprintf(`SELECT id, time_us, subjects, tier, endpoint, cost, allowed, degraded, replayed, kind,
    limits.rule_id, limits.identifier, limits.limit_value, limits.allowed, limits.shadow
FROM %s.decisions
WHERE time >= toDateTime(%d) AND time <= toDateTime(%d) AND time_us >= %d AND time_us < %d
ORDER BY time_us, allowed DESC, id`, db, lo.Unix(), hi.Unix(), lo.UnixMicro(), hi.UnixMicro())
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
			lRule, lID                []string
			lLimit                    []int64
			lAllowed, lShadow         []uint8
		)
		if err := rows.Scan(&r.ID, &r.TimeUS, &r.Subjects, &r.Tier, &r.Endpoint, &r.Cost, &allowed, &degraded, &replay, &r.Kind,
			&lRule, &lID, &lLimit, &lAllowed, &lShadow); err != nil {
			return fmt.Errorf("read the audit: %w", err)
		}
		r.Allowed, r.Degraded, r.Replayed = allowed == 1, degraded == 1, replay == 1
		r.Limits = make([]RecordedLimit, len(lRule))
		for i := range lRule {
			r.Limits[i] = RecordedLimit{Rule: lRule[i], Identifier: lID[i], Limit: lLimit[i], Allowed: lAllowed[i] == 1, Shadow: lShadow[i] == 1}
		}
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
