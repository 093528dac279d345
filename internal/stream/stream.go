// Package stream is the contract of quotaflow's decision stream, shared by the checkers that
// publish it (package publisher) and the aggregators that consume it (package aggregator): the
// JetStream stream's name, its subjects, how decisions are spread over partitions and the
// headers of its messages. docs/architecture.md describes it.
//
// A message is one batch of decisions of one partition (a quotaflowv1.DecisionBatch) published
// to <prefix>.<partition>. Its Nats-Msg-Id is unique per batch, so that the stream drops a
// batch re-sent after a lost ack, and CountHeader holds the number of decisions in it.
package stream

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const (
	// Name is the decision stream's default name.
	Name = "QUOTAFLOW_DECISIONS"
	// SubjectPrefix is the default prefix of its subjects: partition p is <prefix>.<p>, and
	// the stream takes <prefix>.>.
	SubjectPrefix = "quotaflow.decisions"
	// Partitions is the default number of partitions. Every checker and aggregator of one
	// stream must use the same number: it decides which partition a subject's decisions go to.
	Partitions = 16
	// MaxPartitions bounds the number of partitions.
	MaxPartitions = 1024
	// CountHeader is the message header that holds the number of decisions in a batch.
	CountHeader = "Quotaflow-Count"
	// MsgIDHeader is JetStream's deduplication header: the batch's id.
	MsgIDHeader = "Nats-Msg-Id"
)

// ConsumerName is the durable consumer of partition p that the aggregators share: one per
// partition, so that the partition's decisions are stored in order by whichever aggregator
// owns it. No other role may touch it (package natsauth).
func ConsumerName(p int) string { return "quotaflow-aggregator-" + strconv.Itoa(p) }

// Subject returns the subject of partition p under prefix.
func Subject(prefix string, p int) string {
	return prefix + "." + strconv.Itoa(p)
}

// Partition returns the partition, in [0, partitions), of a decision whose first subject is s:
// FNV-1a over "<dimension number>:<identifier>". All decisions of one subject land in one
// partition, so that one aggregator sees them in order. A nil subject is partition 0.
func Partition(s *quotaflowv1.Subject, partitions int) int {
	if s == nil || partitions <= 1 {
		return 0
	}
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	var num [12]byte
	h := uint32(offset32)
	for _, c := range strconv.AppendInt(num[:0], int64(s.Dimension), 10) {
		h = (h ^ uint32(c)) * prime32
	}
	h = (h ^ ':') * prime32
	id := s.Identifier
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * prime32
	}
	return int(h % uint32(partitions))
}

// Describe is a decision as one line, for people watching the stream (quotaflow watch): time,
// verdict, first subject, endpoint, deciding rule with remaining/limit, state, tier, id and
// flags.
func Describe(d *quotaflowv1.Decision) string {
	verdict := "ALLOW"
	switch {
	case !d.Allowed:
		verdict = "DENY "
	case d.DelayUs > 0:
		verdict = "DELAY"
	}
	subject := "-"
	if s := d.Subject; s != nil {
		subject = strings.ToLower(strings.TrimPrefix(s.Dimension.String(), "DIMENSION_")) + ":" + s.Identifier
	}
	rule := "(no rule)"
	if d.RuleId != "" {
		rule = fmt.Sprintf("%s %d/%d", d.RuleId, d.Remaining, d.Limit)
	}
	var flags []string
	if d.Shadow {
		flags = append(flags, "shadow-deny")
	}
	if d.Degraded {
		flags = append(flags, "degraded:"+d.FailMode)
	}
	if d.Replayed {
		flags = append(flags, "replayed")
	}
	if !d.Allowed {
		flags = append(flags, fmt.Sprintf("retry=%dms", d.RetryAfterMs))
	}
	if d.DelayUs > 0 {
		flags = append(flags, fmt.Sprintf("delay=%dms", (d.DelayUs+999)/1000))
	}
	switch d.Kind {
	case quotaflowv1.Kind_KIND_UNSPECIFIED:
	case quotaflowv1.Kind_KIND_RESERVE:
		flags = append(flags, fmt.Sprintf("reserve=%d", d.EstimatedCost))
	case quotaflowv1.Kind_KIND_LEASE_RELEASE, quotaflowv1.Kind_KIND_LEASE_EXPIRED:
		verdict = strings.TrimPrefix(d.Kind.String(), "KIND_LEASE_")
	case quotaflowv1.Kind_KIND_RECOVERED:
		verdict = "RECOVERED"
	default:
		verdict = strings.TrimPrefix(d.Kind.String(), "KIND_")
		flags = append(flags, fmt.Sprintf("estimate=%d actual=%d", d.EstimatedCost, d.ActualCost))
		if d.Overage {
			flags = append(flags, "overage")
		}
	}
	return fmt.Sprintf("%s %s %-24s %-24s %-28s %-8s tier=%s id=%s %s",
		time.UnixMicro(d.TimeUs).UTC().Format("15:04:05.000000"), verdict, subject, d.Endpoint, rule,
		strings.ToLower(strings.TrimPrefix(d.State.String(), "STATE_")), d.Tier, d.Id, strings.Join(flags, " "))
}

// dimensionNames are the names of the decisions' dimensions in the audit and the events
// ("user", "api_key", "unspecified"): quotaflowv1.Dimension's own names, lower case and without
// their prefix, so that a dimension added to the enum is named without another table.
var dimensionNames = func() map[quotaflowv1.Dimension]string {
	names := make(map[quotaflowv1.Dimension]string, len(quotaflowv1.Dimension_name))
	for v, n := range quotaflowv1.Dimension_name {
		names[quotaflowv1.Dimension(v)] = strings.ToLower(strings.TrimPrefix(n, "DIMENSION_"))
	}
	return names
}()

// DimensionName is d as the audit's rows and the warning events name it ("api_key"),
// "unspecified" for a value the enum does not know.
func DimensionName(d quotaflowv1.Dimension) string {
	if n, ok := dimensionNames[d]; ok {
		return n
	}
	return dimensionNames[quotaflowv1.Dimension_DIMENSION_UNSPECIFIED]
}

// ParseDimensionName is the dimension the audit names name (DimensionName's inverse).
func ParseDimensionName(name string) (quotaflowv1.Dimension, bool) {
	for d, n := range dimensionNames {
		if n == name && d != quotaflowv1.Dimension_DIMENSION_UNSPECIFIED {
			return d, true
		}
	}
	return 0, false
}
