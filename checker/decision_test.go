package checker

import (
	"context"
	"sync"
	"testing"
)

// durableRecorder is a DurableSink that records which method each decision came through, and
// the context PublishDurable got.
type durableRecorder struct {
	mu      sync.Mutex
	durable []string // decision ids handed to PublishDurable
	plain   []string // decision ids handed to Publish
	ctxs    []context.Context
}

func (r *durableRecorder) Publish(_ string, _ *Query, out *Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plain = append(r.plain, out.ID)
}

func (r *durableRecorder) PublishDurable(ctx context.Context, _ string, _ *Query, out *Outcome) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.durable = append(r.durable, out.ID)
	r.ctxs = append(r.ctxs, ctx)
	return true
}

func (r *durableRecorder) PublishDurableAll(ctx context.Context, id string, qs []*Query, outs []*Outcome) bool {
	for i, out := range outs {
		r.PublishDurable(ctx, id, qs[i], out)
	}
	return true
}

// TestDurableSink: a sink that can hold a check until its decision is durable gets every
// consuming check's decision through PublishDurable, with the check's context, before Check
// returns; never through Publish. A peek publishes nothing.
func TestDurableSink(t *testing.T) {
	t.Parallel()
	sink := &durableRecorder{}
	e := newEngine(t, Config{Decisions: sink})
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "the check's")
	for i := range 6 { // past the burst of 4: denials are published too
		out, err := e.Check(ctx, userQuery("durable-sink", "/api/x"))
		if err != nil {
			t.Fatal(err)
		}
		sink.mu.Lock()
		got := len(sink.durable)
		last := ""
		if got > 0 {
			last = sink.durable[got-1]
		}
		sink.mu.Unlock()
		if got != i+1 || last != out.ID {
			t.Fatalf("check %d (%s) returned with %d decisions published durably, the last %q; want it among them", i, out.ID, got, last)
		}
	}
	if _, err := e.Peek(ctx, userQuery("durable-sink", "/api/x")); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.plain) != 0 || len(sink.durable) != 6 {
		t.Errorf("%d decisions through Publish and %d through PublishDurable, want 0 and 6", len(sink.plain), len(sink.durable))
	}
	for _, c := range sink.ctxs {
		if c.Value(key{}) != "the check's" {
			t.Errorf("PublishDurable got a context without the check's values")
			break
		}
	}
}
