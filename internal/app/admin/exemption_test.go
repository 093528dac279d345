package admin

import (
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// TestExemptionThroughAPI: an exemption put through the API is listed, reaches the checker
// (the user's checks pass the exempted rule), and its deletion ends it; deleting a rule an
// exemption names is refused.
func TestExemptionThroughAPI(t *testing.T) {
	t.Parallel()
	env, _ := newAdminEnv(t, adminRules, Config{})
	user := "exempt-" + time.Now().Format("150405.000000")
	check := func() *checker.Outcome {
		t.Helper()
		out, err := env.engine.Check(t.Context(), &checker.Query{Subjects: []checker.Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/orders", Cost: 10})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := env.call(t, "PUT", "/api/v1/exemptions/ci", writeToken, `{"dimension":"user","value":"`+user+`","rules":["orders"],"reason":"CI load"}`); got.status != 201 {
		t.Fatalf("PUT: %d %s", got.status, got.raw)
	}
	if got := env.call(t, "GET", "/api/v1/exemptions", readToken, nil); got.status != 200 || len(got.body["exemptions"].([]any)) != 1 {
		t.Fatalf("GET: %d %s, want the one exemption", got.status, got.raw)
	}
	poll.Until(t, 10*time.Second, "the checker exempting the user", poll.True(func() bool { return check().Exemption == "ci" }))
	for range 3 { // cost 10 of a limit of 10, three times: only the exemption lets them all pass
		if out := check(); !out.Allowed {
			t.Fatalf("exempt check denied: %+v", out)
		}
	}
	if got := env.call(t, "DELETE", "/api/v1/rules/orders", writeToken, nil); got.status != 400 {
		t.Errorf("deleting the exempted rule: %d %s, want 400", got.status, got.raw)
	}
	if got := env.call(t, "DELETE", "/api/v1/exemptions/ci", writeToken, nil); got.status != 204 {
		t.Fatalf("DELETE: %d %s", got.status, got.raw)
	}
	poll.Until(t, 10*time.Second, "the exemption gone from the checker", poll.True(func() bool { return !check().Allowed }))
}
