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
