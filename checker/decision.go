package checker

import (
	"context"
	"strconv"
)

// DecisionSink receives every decision the engine makes (allowed, denied, shadow, degraded),
// for the decision stream. publisher.Client satisfies it, rendering each decision as the
// stream's event.
type DecisionSink interface {
	// Publish receives out, the decision of q made by the checker checkerID. It is called on
	// the check's path, before Check returns: it must return at once, never fail the check,
	// and keep neither q nor out (they are the caller's once Check returns): what it keeps, it
	// copies or renders before returning.
	Publish(checkerID string, q *Query, out *Outcome)
}

// DurableSink is a DecisionSink that can hold a check until its decision would survive a
// crash of the process. The engine calls PublishDurable instead of Publish when its sink has
// it, so that no answer leaves whose decision a kill -9 could lose. publisher.Client has it:
// it returns once the decision is written to its spool file.
type DurableSink interface {
	DecisionSink
	// PublishDurable is Publish that returns once the decision is durable, once the sink gives
	// up waiting (after a bounded time, which it counts), or once ctx is done. Like Publish it
	// never fails the check: an answer whose decision could not be made durable still leaves.
	// It reports whether the decision is as durable as the sink makes decisions: the engine
	// then drops the balance journal's entries of it, which would otherwise be published
	// again (bucket.JournalEntry).
	PublishDurable(ctx context.Context, checkerID string, q *Query, out *Outcome) bool
	// PublishDurableAll is PublishDurable of the decisions outs[i] of qs[i] (Engine.CheckAll),
	// with one wait for all of them rather than one after another; it reports whether all are
	// durable.
	PublishDurableAll(ctx context.Context, checkerID string, qs []*Query, outs []*Outcome) bool
}

// nextDecisionID returns "<instance id>-<sequence>": unique without coordination or a random
// draw per decision.
func (e *Engine) nextDecisionID() string {
	n := e.decisionSeq.Add(1)
	// Built on the stack when it fits, so that the string is the one allocation.
	var buf [96]byte
	b := append(buf[:0], e.instanceID...)
	b = append(b, '-')
	return string(strconv.AppendUint(b, n, 10))
}
