package aggregator

import (
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// columnList is the insert's column list, in the order appendTo fills them. ClickHouse 18.16
// needs the list on a batch insert.
var columnList = strings.Join([]string{
	"id", "checker_id", "time", "time_us", "subject_dimension", "subject_id", "subjects",
	"tier", "endpoint", "rule_id", "algorithm", "cost", "allowed", "shadow", "degraded",
	"fail_mode", "limit_value", "remaining", "current_count", "window_ms", "reset_at",
	"retry_after_ms", "state", "replayed", "clock_skew_ms",
	"limits.rule_id", "limits.dimension", "limits.identifier", "limits.endpoint",
	"limits.algorithm", "limits.limit_value", "limits.window_ms", "limits.allowed",
	"limits.current_count", "limits.remaining", "limits.reset_at", "limits.retry_after_ms",
	"limits.shadow", "limits.state", "limits.degraded", "limits.fail_mode", "limits.burst",
	"partition", "stream_seq", "batch_id", "ingested_at",
	"kind", "reservation_id", "estimated_cost", "actual_cost", "overage", "lease_id",
	"exemption", "limits.candidate_of", "delay_us",
	"ledger.entitlement", "ledger.dimension", "ledger.subject", "ledger.kind", "ledger.grant_id", "ledger.amount",
	"ledger.period_start", "ledger.period_end",
}, ", ")

// row is one decision with where it came from in the stream.
type row struct {
	d       *quotaflowv1.Decision
	p       int
	seq     uint64
	batchID string
}

// columns holds a batch's rows until they are inserted.
type columns struct {
	rows []row
}

func (c *columns) len() int { return len(c.rows) }

func (c *columns) add(d *quotaflowv1.Decision, p int, seq uint64, batchID string) {
	c.rows = append(c.rows, row{d, p, seq, batchID})
}

func (c *columns) reset() {
	clear(c.rows)
	c.rows = c.rows[:0]
}

// filter keeps the rows keep accepts and returns how many it dropped.
func (c *columns) filter(keep func(p int, seq uint64) bool) int {
	kept := c.rows[:0]
	for _, r := range c.rows {
		if keep(r.p, r.seq) {
			kept = append(kept, r)
		}
	}
	dropped := len(c.rows) - len(kept)
	clear(c.rows[len(kept):])
	c.rows = kept
	return dropped
}

// kind is a row's kind column (schema migration 0007): ” for a check.
func kind(k quotaflowv1.Kind) string {
	switch k {
	case quotaflowv1.Kind_KIND_RESERVE:
		return "reserve"
	case quotaflowv1.Kind_KIND_SETTLE:
		return "settle"
	case quotaflowv1.Kind_KIND_CANCEL:
		return "cancel"
	case quotaflowv1.Kind_KIND_LEASE_RELEASE:
		return "lease_release"
	case quotaflowv1.Kind_KIND_LEASE_EXPIRED:
		return "lease_expired"
	case quotaflowv1.Kind_KIND_RECOVERED:
		return "recovered"
	}
	return ""
}

func state(s quotaflowv1.State) string {
	switch s {
	case quotaflowv1.State_STATE_NORMAL:
		return "normal"
	case quotaflowv1.State_STATE_WARNING:
		return "warning"
	case quotaflowv1.State_STATE_THROTTLED:
		return "throttled"
	}
	return "unspecified"
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// appendTo fills the batch column by column: one Append per column instead of one per value.
func (c *columns) appendTo(b driver.Batch) error {
	n := len(c.rows)
	var (
		ids, checkers, dims, subjectIDs, tiers, endpoints, rules, algos, failModes, states, batchIDs = mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n), mk[string](n)
		kinds, reservations, leases, estimates, actuals, overages                                    = mk[string](n), mk[string](n), mk[string](n), mk[int64](n), mk[int64](n), mk[uint8](n)
		exemptions                                                                                   = mk[string](n)
		delays                                                                                       = mk[int64](n)
		times, resets, ingested                                                                      = mk[time.Time](n), mk[time.Time](n), mk[time.Time](n)
		timeUS, costs, limits, remaining, counts, windows, retries, skews                            = mk[int64](n), mk[int64](n), mk[int64](n), mk[int64](n), mk[int64](n), mk[int64](n), mk[int64](n), mk[int64](n)
		allowed, shadow, degraded, replayed                                                          = mk[uint8](n), mk[uint8](n), mk[uint8](n), mk[uint8](n)
		subjects                                                                                     = mk[[]string](n)
		partitions                                                                                   = mk[uint16](n)
		seqs                                                                                         = mk[uint64](n)
		lRule, lDim, lID, lEndpoint, lAlgo, lState, lFail, lCandidate                                = mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n)
		lLimit, lWindow, lCount, lRemaining, lRetry, lBurst                                          = mk[[]int64](n), mk[[]int64](n), mk[[]int64](n), mk[[]int64](n), mk[[]int64](n), mk[[]int64](n)
		lAllowed, lShadow, lDegraded                                                                 = mk[[]uint8](n), mk[[]uint8](n), mk[[]uint8](n)
		lReset                                                                                       = mk[[]time.Time](n)
		gEnt, gDim, gSubject, gKind, gGrant                                                          = mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n), mk[[]string](n)
		gAmount                                                                                      = mk[[]int64](n)
		gStart, gEnd                                                                                 = mk[[]time.Time](n), mk[[]time.Time](n)
	)
	now := time.Now().UTC().Truncate(time.Second)
	for i, r := range c.rows {
		d := r.d
		ids[i], checkers[i] = d.Id, d.CheckerId
		times[i], timeUS[i] = time.UnixMicro(d.TimeUs).UTC(), d.TimeUs
		dims[i], subjectIDs[i] = stream.DimensionName(d.GetSubject().GetDimension()), d.GetSubject().GetIdentifier()
		ss := make([]string, len(d.Subjects))
		for j, s := range d.Subjects {
			ss[j] = stream.DimensionName(s.Dimension) + ":" + s.Identifier
		}
		subjects[i] = ss
		tiers[i], endpoints[i], rules[i], algos[i] = d.Tier, d.Endpoint, d.RuleId, d.Algorithm
		costs[i], allowed[i], shadow[i], degraded[i] = d.Cost, b2u(d.Allowed), b2u(d.Shadow), b2u(d.Degraded)
		failModes[i], limits[i], remaining[i], counts[i], windows[i] = d.FailMode, d.Limit, d.Remaining, d.CurrentCount, d.WindowMs
		resets[i], retries[i], states[i] = time.Unix(d.ResetAt, 0).UTC(), d.RetryAfterMs, state(d.State)
		replayed[i], skews[i] = b2u(d.Replayed), d.ClockSkewMs
		k := len(d.Limits)
		lRule[i], lDim[i], lID[i], lEndpoint[i], lAlgo[i], lState[i], lFail[i], lCandidate[i] = make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k), make([]string, k)
		lLimit[i], lWindow[i], lCount[i], lRemaining[i], lRetry[i], lBurst[i] = make([]int64, k), make([]int64, k), make([]int64, k), make([]int64, k), make([]int64, k), make([]int64, k)
		lAllowed[i], lShadow[i], lDegraded[i], lReset[i] = make([]uint8, k), make([]uint8, k), make([]uint8, k), make([]time.Time, k)
		for j, l := range d.Limits {
			lRule[i][j], lDim[i][j], lID[i][j], lEndpoint[i][j], lAlgo[i][j] = l.RuleId, stream.DimensionName(l.Dimension), l.Identifier, l.Endpoint, l.Algorithm
			lLimit[i][j], lWindow[i][j], lAllowed[i][j], lCount[i][j], lRemaining[i][j] = l.Limit, l.WindowMs, b2u(l.Allowed), l.CurrentCount, l.Remaining
			lReset[i][j], lRetry[i][j], lShadow[i][j], lState[i][j] = time.Unix(l.ResetAt, 0).UTC(), l.RetryAfterMs, b2u(l.Shadow), state(l.State)
			lDegraded[i][j], lFail[i][j], lBurst[i][j], lCandidate[i][j] = b2u(l.Degraded), l.FailMode, l.Burst, l.CandidateOf
		}
		gEnt[i], gDim[i], gSubject[i], gKind[i], gGrant[i], gAmount[i], gStart[i], gEnd[i] = ledgerColumns(d)
		partitions[i], seqs[i], batchIDs[i], ingested[i] = uint16(r.p), r.seq, r.batchID, now
		kinds[i], reservations[i], leases[i] = kind(d.Kind), d.ReservationId, d.LeaseId
		estimates[i], actuals[i], overages[i] = d.EstimatedCost, d.ActualCost, b2u(d.Overage)
		exemptions[i], delays[i] = d.Exemption, d.DelayUs
	}
	cols := []any{
		ids, checkers, times, timeUS, dims, subjectIDs, subjects, tiers, endpoints, rules, algos,
		costs, allowed, shadow, degraded, failModes, limits, remaining, counts, windows, resets,
		retries, states, replayed, skews,
		lRule, lDim, lID, lEndpoint, lAlgo, lLimit, lWindow, lAllowed, lCount, lRemaining, lReset,
		lRetry, lShadow, lState, lDegraded, lFail, lBurst,
		partitions, seqs, batchIDs, ingested,
		kinds, reservations, estimates, actuals, overages, leases,
		exemptions, lCandidate, delays,
		gEnt, gDim, gSubject, gKind, gGrant, gAmount, gStart, gEnd,
	}
	for i, col := range cols {
		if err := b.Column(i).Append(col); err != nil {
			return fmt.Errorf("column %d of (%s): %w", i, columnList, err)
		}
	}
	return nil
}

func mk[T any](n int) []T { return make([]T, n) }

// ledgerColumns are the ledger entries of d's balances (LimitStatus.ledger), flattened with
// their entitlement and holder: the decisions' ledger Nested column, which a view copies into
// the ledger table (schema 0013).
func ledgerColumns(d *quotaflowv1.Decision) (ent, dim, subject, kind, grant []string, amount []int64, start, end []time.Time) {
	ent, dim, subject, kind, grant, amount, start, end = []string{}, []string{}, []string{}, []string{}, []string{}, []int64{}, []time.Time{}, []time.Time{}
	for _, l := range d.Limits {
		if len(l.Ledger) == 0 {
			continue
		}
		hd, hs := holder(l)
		for _, e := range l.Ledger {
			ent, dim, subject, kind, grant = append(ent, l.RuleId), append(dim, hd), append(subject, hs), append(kind, e.Kind), append(grant, e.GrantId)
			amount, start, end = append(amount, e.Amount), append(start, time.Unix(e.PeriodStart, 0).UTC()), append(end, time.Unix(e.PeriodEnd, 0).UTC())
		}
	}
	return
}
