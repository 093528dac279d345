package checker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// batchSink is a DurableSink that counts the calls of each method and keeps every
// decision id it was handed.
type batchSink struct {
	mu         sync.Mutex
	ids        []string
	alls, ones int
}

func (s *batchSink) Publish(string, *Query, *Outcome) {}

func (s *batchSink) PublishDurable(_ context.Context, _ string, _ *Query, out *Outcome) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ones++
	s.ids = append(s.ids, out.ID)
	return true
}

func (s *batchSink) PublishDurableAll(_ context.Context, _ string, qs []*Query, outs []*Outcome) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.alls++
	for i, out := range outs {
		if qs[i] == nil {
			panic("a decision without its query")
		}
		s.ids = append(s.ids, out.ID)
	}
	return true
}

// TestCheckAll: the checks of one CheckAll are decided each on its own and exactly, across
// chunks (allChunk) too: a user checked 300 times at a burst of 4 is allowed exactly 4 times,
// another user's 3 checks are all allowed, and a malformed check fails alone at its index with
// a FieldError. Every decision reaches the durable sink in one PublishDurableAll, and never
// through PublishDurable; the failed check's is not published.
func TestCheckAll(t *testing.T) {
	t.Parallel()
	sink := &batchSink{}
	e := newEngine(t, Config{Decisions: sink})
	hot, calm := checkertest.ID(t, "hot"), checkertest.ID(t, "calm")
	var qs []*Query
	for i := range 300 {
		qs = append(qs, userQuery(hot, "/api/x"))
		if i%100 == 0 {
			qs = append(qs, userQuery(calm, "/api/y"))
		}
	}
	bad := len(qs)
	qs = append(qs, userQuery(calm, "api"))

	outs, errs := e.CheckAll(context.Background(), qs)
	if len(outs) != len(qs) || len(errs) != len(qs) {
		t.Fatalf("CheckAll of %d checks: %d outcomes, %d errors; want %d of each", len(qs), len(outs), len(errs), len(qs))
	}
	allowed := map[string]int{}
	ids := map[string]bool{}
	for i, out := range outs {
		if i == bad {
			var fe *FieldError
			if !errors.As(errs[i], &fe) || fe.Field != "endpoint" || out != nil {
				t.Fatalf("check %d (endpoint \"api\"): %+v, %v; want a FieldError naming endpoint", i, out, errs[i])
			}
			continue
		}
		if errs[i] != nil || out == nil {
			t.Fatalf("check %d: %+v, %v; want an outcome", i, out, errs[i])
		}
		if out.Degraded {
			t.Fatalf("check %d degraded: Redis answers", i)
		}
		if out.Allowed {
			allowed[qs[i].Subjects[0].ID]++
		}
		if ids[out.ID] {
			t.Fatalf("decision id %q given twice", out.ID)
		}
		ids[out.ID] = true
	}
	if allowed[hot] != 4 || allowed[calm] != 3 {
		t.Errorf("allowed: hot %d, calm %d; want 4 (the burst) and 3", allowed[hot], allowed[calm])
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.alls != 1 || sink.ones != 0 || len(sink.ids) != len(qs)-1 {
		t.Errorf("sink: %d PublishDurableAll, %d PublishDurable, %d decisions; want 1, 0 and %d", sink.alls, sink.ones, len(sink.ids), len(qs)-1)
	}
}

// TestCheckAllRedisDown: with Redis unreachable, each check of a CheckAll is answered by its
// rule's fail mode, flagged degraded: open allows, closed denies. None is an error.
func TestCheckAllRedisDown(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	e := newEngine(t, Config{Redis: rdb, Rules: checkertest.Rules(t, `
default_tier: free
tiers: {free: {}}
rules:
  - {id: open, dimension: user, endpoint: /open, algorithm: gcra, limit: 10, window: 1m, fail_mode: open}
  - {id: closed, dimension: user, endpoint: /closed, algorithm: gcra, limit: 10, window: 1m, fail_mode: closed}
`)})
	var qs []*Query
	for i := range 6 {
		endpoint := "/open"
		if i%2 == 1 {
			endpoint = "/closed"
		}
		qs = append(qs, &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: fmt.Sprint("u", i)}}, Endpoint: endpoint, Cost: 1})
	}
	outs, errs := e.CheckAll(context.Background(), qs)
	if errs != nil {
		t.Fatalf("errors %v; want outcomes by fail mode", errs)
	}
	for i, out := range outs {
		if want := i%2 == 0; !out.Degraded || out.Allowed != want {
			t.Errorf("check %d at %s: allowed %v, degraded %v; want allowed %v, degraded", i, qs[i].Endpoint, out.Allowed, out.Degraded, want)
		}
	}
}
