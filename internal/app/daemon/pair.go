package daemon

import (
	"context"
	"errors"

	"github.com/quotaflow/quotaflow/internal/instance"
	"github.com/quotaflow/quotaflow/internal/telemetry"
)

// ServePair runs a checker and an aggregator in one process (quotaflow serve) until ctx is
// done or either stops, then closes both. They share one telemetry, so that the checker's
// /metrics serves the aggregator's instruments (quotaflow_aggregator_*) too, and, unless
// checker names its own, the admin API's backtests read the audit this aggregator writes.
// The checker starts first, as its admin connection creates the rule store that the
// aggregator's role may only bind, and closes first, so that its last decisions drain to the
// stream while the aggregator still runs. Its errors are StartChecker's and StartAggregator's.
func ServePair(ctx context.Context, checker CheckerConfig, agg AggregatorConfig) error {
	checker.Tracing.Instance = instance.Named(checker.InstanceID)
	tel, err := telemetry.Setup(ctx, checker.Tracing)
	if err != nil {
		if checker.Redis != nil {
			checker.Redis.Close() // the checker owns it, started or not
		}
		return err
	}
	defer CloseTelemetry(tel)
	agg.Telemetry, agg.Logger, checker.Telemetry = tel, checker.Logger, tel
	if checker.AuditClickHouseDSN == "" {
		checker.AuditClickHouseDSN, checker.AuditClickHouseTLS = agg.ClickHouseDSN, agg.ClickHouseTLS
	}
	chk, err := StartChecker(ctx, checker)
	if err != nil {
		return err
	}
	a, err := StartAggregator(ctx, agg)
	if err != nil {
		return errors.Join(err, chk.Close())
	}
	select {
	case <-ctx.Done():
	case <-a.Done():
	case <-chk.Done():
	}
	return errors.Join(chk.Close(), a.Close())
}
