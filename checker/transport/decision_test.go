package transport

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/publisher"
)

// recorder is a checker.DecisionSink that keeps every decision as the stream's event, rendered
// by publisher.Decision, as publisher.Client renders them.
type recorder struct {
	mu        sync.Mutex
	decisions []*quotaflowv1.Decision
}

func (r *recorder) Publish(checkerID string, q *checker.Query, out *checker.Outcome) {
	d := publisher.Decision(checkerID, q, out)
	r.mu.Lock()
	r.decisions = append(r.decisions, d)
	r.mu.Unlock()
}

func (r *recorder) byID() map[string]*quotaflowv1.Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]*quotaflowv1.Decision, len(r.decisions))
	for _, d := range r.decisions {
		m[d.Id] = d
	}
	return m
}

// TestDecisionEvents: every consuming check makes exactly one event matching its response;
// peeks and invalid requests make none.
func TestDecisionEvents(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	env := newEnv(t, checker.Config{Decisions: rec, InstanceID: "test-checker"})
	c := env.client("connect")
	user := id(t, "u")
	var responses []*quotaflowv1.CheckRateLimitResponse
	for i := 0; i < 6; i++ { // 5 allowed, 1 denied
		responses = append(responses, mustCheck(t, c, checkReq(user, "/orders")))
	}
	mustCheck(t, c, checkReq(user, "/shadow")) // spends the shadow limit
	shadowed := mustCheck(t, c, checkReq(user, "/shadow"))
	responses = append(responses, shadowed)
	idem := checkReq(user, "/tb")
	idem.Msg.IdempotencyKey = "k"
	responses = append(responses, mustCheck(t, c, idem), mustCheck(t, c, idem))
	multi := connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/api/x", Timestamp: 1, Subjects: []*quotaflowv1.Subject{
		{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: id(t, "ip")},
		{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}})
	multi.Msg.Timestamp = 0
	responses = append(responses, mustCheck(t, c, multi))

	// Neither a peek nor an invalid request is a decision.
	if _, err := c.GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders"})); err != nil {
		t.Fatal(err)
	}
	c.CheckRateLimit(context.Background(), checkReq("", "/orders"))

	events := rec.byID()
	if got, want := len(rec.decisions), len(responses)+1; got != want { // +1: the first shadow check
		t.Fatalf("%d events for %d checks, want one each", got, want)
	}
	for i, r := range responses {
		d := events[r.DecisionId]
		switch {
		case r.DecisionId == "" || !strings.HasPrefix(r.DecisionId, "test-checker-"):
			t.Errorf("response %d: decision_id %q, want test-checker-<n>", i, r.DecisionId)
		case d == nil:
			t.Errorf("response %d: no event with id %q", i, r.DecisionId)
		case d.CheckerId != "test-checker" || d.Allowed != r.Allowed || d.RuleId != r.RuleId || d.Remaining != r.Remaining ||
			d.Limit != r.Limit || d.ResetAt != r.ResetAt || d.State != r.State || d.Replayed != r.Replayed || d.Tier != r.Tier ||
			len(d.Limits) != len(r.Limits) || d.RetryAfterMs != r.RetryAfterMs || d.CurrentCount != r.CurrentCount:
			t.Errorf("response %d: event %v does not match response %v", i, d, r)
		case d.TimeUs == 0 || d.Cost != 1 || d.Subject == nil:
			t.Errorf("response %d: event %v lacks time, cost or subject", i, d)
		}
	}
	if d := events[responses[5].DecisionId]; d.Allowed || d.State != quotaflowv1.State_STATE_THROTTLED {
		t.Errorf("denied check's event: allowed %v state %s, want a throttled denial", d.Allowed, d.State)
	}
	if d := events[shadowed.DecisionId]; !d.Allowed || !d.Shadow {
		t.Errorf("shadow check's event: allowed %v shadow %v, want allowed with shadow set", d.Allowed, d.Shadow)
	}
	if d := events[responses[8].DecisionId]; !d.Replayed {
		t.Error("idempotent retry's event: replayed = false, want true")
	}
	d := events[responses[9].DecisionId]
	if d.Subject.GetDimension() != quotaflowv1.Dimension_DIMENSION_IP || len(d.Subjects) != 2 || d.Endpoint != "/api/x" {
		t.Errorf("multi-subject event: subject %v subjects %v endpoint %q, want the IP first of two, /api/x", d.Subject, d.Subjects, d.Endpoint)
	}

	// Forward-auth decisions are events too, and the id is in the answer.
	req, _ := http.NewRequest(http.MethodGet, env.url+"/ratelimit/check?endpoint=/orders", nil)
	req.Header.Set("X-User-Id", user)
	resp, err := env.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fid := resp.Header.Get("X-Quotaflow-Decision-Id"); rec.byID()[fid] == nil {
		t.Errorf("forward-auth decision %q has no event", fid)
	}
}

// TestDegradedDecisionEvent: a decision made by fail mode is an event flagged degraded, with the
// fail mode and the checker's clock.
func TestDegradedDecisionEvent(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	rs, env := newFailureEnv(t, rec)
	rs.Stop()
	r := mustCheck(t, env.client("connect"), checkReq("u", "/fm/closed"))
	d := rec.byID()[r.DecisionId]
	if d == nil || !d.Degraded || d.FailMode != "closed" || d.Allowed || d.TimeUs == 0 {
		t.Errorf("degraded event = %v, want degraded, fail mode closed, denied, timed", d)
	}
}
