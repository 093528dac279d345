package checker

import (
	"context"
)

// allChunk is how many checks of a CheckAll are in flight at once: as many as one batching
// loop sends in one batch script call (bucket's default MaxBatch), each chunk with its own
// deadline.
const allChunk = 128

// CheckAll decides the checks qs as Check decides each, and returns their answers in order:
// outs[i] is check i's outcome, or errs[i] its error (errs is nil when no check failed). The
// checks are independent: each is charged or denied on its own, exactly as by Check, and one
// check's error fails only that check.
//
// What the checks share is the way there and back: the checks of a chunk (allChunk) are
// planned and their store calls queued before the first is waited for, so that their calls
// leave together (one batch script call per free batching loop, not one goroutine and one
// hand-off per check), under one deadline (Config.RedisTimeout, per chunk: a long batch does
// not run its last checks out of time); and with a DurableSink their decisions are made
// durable together, one wait for all. The order in which checks of one bucket are decided is
// not the order given: chunks and batching loops run concurrently, as separate Checks would.
func (e *Engine) CheckAll(ctx context.Context, qs []*Query) (outs []*Outcome, errs []error) {
	outs = make([]*Outcome, len(qs))
	decided := make([]*Query, 0, len(qs))
	recorded := make([]*Outcome, 0, len(qs))
	cs := make([]started, min(len(qs), allChunk))
	for first := 0; first < len(qs); first += allChunk {
		chunk := qs[first:min(first+allChunk, len(qs))]
		d := deadline{parent: ctx}
		for i, q := range chunk {
			cs[i] = started{}
			e.begin(ctx, &d, q, false, &cs[i])
		}
		for i := range chunk {
			c := &cs[i]
			out, err := e.conclude(c)
			if c.span != nil {
				c.span.End()
			}
			if err != nil {
				if errs == nil {
					errs = make([]error, len(qs))
				}
				errs[first+i] = err
				continue
			}
			e.account(c.ctx, out, c.start)
			outs[first+i] = out
			decided, recorded = append(decided, c.q), append(recorded, out)
		}
		d.release()
	}
	durable := false
	switch {
	case e.durable != nil:
		durable = e.durable.PublishDurableAll(ctx, e.instanceID, decided, recorded)
	case e.sink != nil:
		for i, out := range recorded {
			e.sink.Publish(e.instanceID, decided[i], out)
		}
		durable = true
	}
	if durable && e.journal != nil {
		for _, out := range recorded {
			e.journal.durable(out)
		}
	}
	return outs, errs
}
