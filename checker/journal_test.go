package checker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// spoolSink is a DurableSink that keeps what it is handed, and reports it durable or, as a
// checker killed before its spool write, loses it.
type spoolSink struct {
	lose bool
	mu   sync.Mutex
	got  []Outcome
}

func (s *spoolSink) Publish(_ string, _ *Query, out *Outcome) {
	s.PublishDurable(context.Background(), "", nil, out)
}

func (s *spoolSink) PublishDurable(_ context.Context, _ string, _ *Query, out *Outcome) bool {
	if s.lose {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, *out)
	return true
}

func (s *spoolSink) PublishDurableAll(ctx context.Context, id string, qs []*Query, outs []*Outcome) bool {
	for i, out := range outs {
		s.PublishDurable(ctx, id, qs[i], out)
	}
	return !s.lose
}

// recovered is what the sink got of the recovered decisions whose ids start with prefix.
func (s *spoolSink) recovered(prefix string) map[string]Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Outcome{}
	for _, o := range s.got {
		if o.Recovered && strings.HasPrefix(o.ID, prefix) {
			out[o.ID] = o
		}
	}
	return out
}

// TestJournalRecovers: the burns of decisions lost between Redis and the spool (a check, a
// recorded usage and a settle of a checker whose sink loses them, as a kill -9 before the
// spool write would) are published again by another checker's sweeper, under their own ids,
// with the moves their answers reported and the check's subject; a decision made durable
// (another checker's, and a check of the losing one's that went to the durable path through
// CheckAll) is not recovered: its entry was dropped.
func TestJournalRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	set := mustRules(t, burnRules)
	lossy := newEngine(t, Config{Rules: set, Decisions: &spoolSink{lose: true}, InstanceID: checkertest.ID(t, "lossy"),
		JournalGrace: time.Hour, DisableOverLimitCache: true})
	kept := newEngine(t, Config{Rules: set, Decisions: &spoolSink{}, InstanceID: checkertest.ID(t, "kept"),
		JournalGrace: time.Hour, DisableOverLimitCache: true})
	user := checkertest.ID(t, "u")
	grantTo(t, lossy, "tokens", user, 100)
	gid := grantID(t, lossy, user)
	sub := []Subject{{Dimension: rules.DimensionUser, ID: user}}

	wantMoves := map[string]string{}
	out, err := lossy.Check(ctx, &Query{Subjects: sub, Endpoint: "/api/chat", Cost: 3})
	if err != nil || !out.Allowed {
		t.Fatalf("a check of 3: %+v, %v", out, err)
	}
	wantMoves[out.ID] = fmt.Sprint(limitOf(out, "tokens").Result.Moves())
	used, err := lossy.RecordUsage(ctx, MeteredUsage{Entitlement: "tokens", Subject: user, Amount: 5, EventID: checkertest.ID(t, "evt")})
	if err != nil {
		t.Fatal(err)
	}
	wantMoves[used.DecisionID] = fmt.Sprint([]bucket.Move{{Kind: bucket.Burned, Grant: gid, N: 5}})
	res, err := kept.Check(ctx, &Query{Subjects: sub, Endpoint: "/other", Entitlement: "tokens", Cost: 10, Reserve: time.Minute})
	if err != nil || res.Reservation == nil {
		t.Fatalf("a reserve of 10: %+v, %v", res, err)
	}
	st, err := lossy.Settle(ctx, res.Reservation.ID, 4)
	if err != nil {
		t.Fatal(err)
	}
	wantMoves[st.ID] = fmt.Sprint([]bucket.Move{{Kind: bucket.GivenBack, Grant: gid, N: 6}})
	if _, err := kept.Check(ctx, &Query{Subjects: sub, Endpoint: "/api/chat", Cost: 2}); err != nil {
		t.Fatal(err)
	}

	sink := &spoolSink{}
	newEngine(t, Config{Rules: set, Decisions: sink, JournalGrace: 500 * time.Millisecond, DisableOverLimitCache: true})
	got := map[string]Outcome{}
	poll.Until(t, 30*time.Second, "the lost decisions recovered", func() error {
		got = sink.recovered(lossy.InstanceID())
		if len(got) < len(wantMoves) {
			return fmt.Errorf("%d of %d recovered", len(got), len(wantMoves))
		}
		return nil
	})
	for id, want := range wantMoves {
		o, ok := got[id]
		if !ok {
			t.Errorf("decision %s not recovered", id)
			continue
		}
		l := o.Limits[0]
		if g := fmt.Sprint(l.Result.Moves()); g != want || l.Rule.ID != "tokens" || l.Subject.ID != user || l.Limit.Limit != 0 {
			t.Errorf("recovered %s: moves %s of %s's %s (limit %d); want %s of %s's tokens, limit 0", id, g, l.Subject.ID, l.Rule.ID, l.Limit.Limit, want, user)
		}
	}
	time.Sleep(2 * time.Second) // two rounds more: a kept decision's entry, had it stayed, is old enough by now
	if other := sink.recovered(kept.InstanceID()); len(other) > 0 {
		t.Errorf("durable decisions recovered: %v", other)
	}
}

// grantID is the id of user's one grant of tokens.
func grantID(t *testing.T, e *Engine, user string) string {
	t.Helper()
	b, err := e.Balance(t.Context(), "tokens", user)
	if err != nil || len(b.Grants) != 1 {
		t.Fatalf("Balance: %+v, %v", b, err)
	}
	return b.Grants[0].ID
}
