package schema

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Table names a table with a retention horizon.
type Table string

// The tables retention applies to.
const (
	Decisions   Table = "decisions"
	UsageMinute Table = "usage_minute"
	UsageHour   Table = "usage_hour"
	UsageDay    Table = "usage_day"
	// IngestedMessages only serves to skip redelivered messages: a week covers the stream's
	// 72h default.
	IngestedMessages Table = "ingested_messages"
	// StateTransitions are the warning-state transitions.
	StateTransitions Table = "state_transitions"
	// Overrides is the override audit (monthly partitions).
	Overrides Table = "overrides"
	// ConfigChanges is the audit of the other configuration changes: rules, users' tiers
	// (monthly partitions).
	ConfigChanges Table = "config_changes"
	// EntitlementEvents are the entitlement thresholds crossed; WebhookDeliveries the webhook
	// endpoints' delivery log.
	EntitlementEvents Table = "entitlement_events"
	WebhookDeliveries Table = "webhook_deliveries"
)

// tables lists every table with a retention horizon: the ones ApplyRetention manages.
var tables = []Table{Decisions, UsageMinute, UsageHour, UsageDay, IngestedMessages, StateTransitions, Overrides, ConfigChanges,
	EntitlementEvents, WebhookDeliveries}

// Horizon is how long a table keeps rows and how it is partitioned.
type Horizon struct {
	Days int
	// Monthly is set for tables partitioned by toYYYYMM, unset for daily (toDate) partitions.
	Monthly bool
}

// Retention returns the horizon of a table (docs/aggregator.md, "Tables"): decisions 90 days,
// usage_minute 30 days, usage_hour and usage_day a year; state_transitions, entitlement_events
// and webhook_deliveries 90 days, overrides and config_changes a year.
func Retention(t Table) Horizon {
	switch t {
	case Decisions, StateTransitions, EntitlementEvents, WebhookDeliveries:
		return Horizon{Days: 90}
	case UsageMinute:
		return Horizon{Days: 30}
	case IngestedMessages:
		return Horizon{Days: 7}
	default:
		return Horizon{Days: 365, Monthly: true}
	}
}

// Dropped is a partition the retention job removed.
type Dropped struct {
	Table       Table
	PartitionID string
}

// ApplyRetention drops every partition of quotaflow's tables in db whose rows are all older
// than the table's horizon at now. Only whole partitions go: a day (or month) is dropped once
// its last instant is past the horizon, so no row is removed early. It works on every server;
// on current servers TTL removes the same rows eventually, this makes it happen on schedule.
func ApplyRetention(ctx context.Context, conn driver.Conn, db string, now time.Time) ([]Dropped, error) {
	return Layout{}.ApplyRetention(ctx, conn, db, now)
}

// ApplyRetention is the package's ApplyRetention in the layout. On a cluster it drops the
// partitions of the local replicated tables on the server conn reaches; a dropped partition
// is a replicated operation, so ZooKeeper carries it to the shard's other replicas (one that
// is down drops it when it comes back). Each shard of a cluster of several needs its own run.
func (l Layout) ApplyRetention(ctx context.Context, conn driver.Conn, db string, now time.Time) ([]Dropped, error) {
	if db == "" {
		db = DefaultDatabase
	}
	if !validIdent(db) {
		return nil, fmt.Errorf("database %q: want letters, digits and underscores", db)
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var dropped []Dropped
	for _, t := range tables {
		h := Retention(t)
		horizon := now.UTC().AddDate(0, 0, -h.Days)
		local := l.Storage(t)
		rows, err := conn.Query(ctx, "SELECT DISTINCT partition_id FROM system.parts WHERE database = ? AND table = ? AND active", db, local)
		if err != nil {
			return dropped, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return dropped, fmt.Errorf("list partitions of %s: %w", t, err)
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return dropped, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		for _, id := range ids {
			end, err := partitionEnd(id, h.Monthly)
			if err != nil {
				return dropped, fmt.Errorf("table %s: %w", t, err)
			}
			if end.After(horizon) {
				continue
			}
			// The id is digits only (checked by partitionEnd), safe to quote.
			if err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.%s DROP PARTITION ID '%s'", db, local, id)); err != nil {
				return dropped, fmt.Errorf("drop partition %s of %s: %w", id, t, err)
			}
			dropped = append(dropped, Dropped{Table: t, PartitionID: id})
		}
	}
	return dropped, nil
}

// partitionEnd returns the first instant after a partition: the next day for YYYYMMDD, the
// next month for YYYYMM.
func partitionEnd(id string, monthly bool) (time.Time, error) {
	layout, want := "20060102", "YYYYMMDD"
	if monthly {
		layout, want = "200601", "YYYYMM"
	}
	start, err := time.ParseInLocation(layout, id, time.UTC)
	if err != nil || len(id) != len(layout) {
		return time.Time{}, fmt.Errorf("partition id %q: want %s", id, want)
	}
	if monthly {
		return start.AddDate(0, 1, 0), nil
	}
	return start.AddDate(0, 0, 1), nil
}
