package admin

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

const grantRules = adminRules + `entitlements:
  - {id: tokens, dimension: user, period: 1mo, mode: soft, overage_cap: 100}
`

// TestGrantsThroughAPI: a grant made with a write token is listed with what it has left,
// voided, and each write is a config event naming the token; bad input is named, a read token
// writes nothing, an unknown entitlement is 404.
func TestGrantsThroughAPI(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, grantRules)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set, err := store.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, checker.Config{Rules: set}, Config{RuleStore: store, ReadPerMinute: 1e6, WritePerMinute: 1e6,
		AuthFailuresPerMinute: 1e6, Tokens: map[string]Token{writeToken: {"alice-ops", RoleWrite}, readToken: {"dashboard", RoleRead}}})
	user := "grants-" + time.Now().Format("150405.000000")
	seen := len(readEvents(t, js))

	made := env.call(t, "POST", "/api/v1/grants", writeToken,
		`{"entitlement":"tokens","subject":"`+user+`","amount":1000,"recurring":true,"rollover":{"min":0,"max":200},"reason":"pro plan"}`)
	if made.status != 201 {
		t.Fatalf("POST: %d %s", made.status, made.raw)
	}
	g := made.body["grant"].(map[string]any)
	id := g["id"].(string)
	if !strings.HasPrefix(id, "gr-") || g["creator"] != "alice-ops" || g["dimension"] != "user" ||
		made.body["balance"].(map[string]any)["remaining"].(float64) != 1000 {
		t.Errorf("POST answered %s, want a grant gr-… made by alice-ops and a balance of 1000", made.raw)
	}
	list := env.call(t, "GET", "/api/v1/grants?entitlement=tokens&subject="+user, readToken, nil)
	if grants := list.body["grants"].([]any); list.status != 200 || len(grants) != 1 || grants[0].(map[string]any)["remaining"].(float64) != 1000 {
		t.Fatalf("GET: %d %s, want the one grant with 1000 left", list.status, list.raw)
	}
	void := env.call(t, "POST", "/api/v1/grants/"+id+"/void", writeToken, `{"entitlement":"tokens","subject":"`+user+`"}`)
	if void.status != 200 || void.body["grant"].(map[string]any)["voided_at"] == nil || void.body["balance"].(map[string]any)["remaining"].(float64) != 0 {
		t.Fatalf("void: %d %s, want the grant voided and nothing left", void.status, void.raw)
	}
	fresh := readEvents(t, js)[seen:]
	if len(fresh) != 2 || fresh[0].subject != "quotaflow.config.grant_issued" || fresh[1].subject != "quotaflow.config.grant_voided" ||
		fresh[0].actor != "alice-ops" || fresh[1].target != id {
		t.Errorf("events %+v, want grant_issued and grant_voided of %s by alice-ops", fresh, id)
	}

	for _, tt := range []struct {
		name, method, path, token, body string
		status                          int
		field                           string
	}{
		{"a read token", "POST", "/api/v1/grants", readToken, `{"entitlement":"tokens","subject":"u","amount":5,"reason":"x"}`, 403, ""},
		{"a negative amount", "POST", "/api/v1/grants", writeToken, `{"entitlement":"tokens","subject":"u","amount":-5,"reason":"x"}`, 400, "amount"},
		{"a huge amount", "POST", "/api/v1/grants", writeToken, `{"entitlement":"tokens","subject":"u","amount":99999999999999999,"reason":"x"}`, 400, "amount"},
		{"an unknown entitlement", "POST", "/api/v1/grants", writeToken, `{"entitlement":"gold","subject":"u","amount":5,"reason":"x"}`, 400, "entitlement"},
		{"an expired grant", "POST", "/api/v1/grants", writeToken, `{"entitlement":"tokens","subject":"u","amount":5,"reason":"x","expires_at":"2020-01-01T00:00:00Z"}`, 400, "expires_at"},
		{"a forged maker", "POST", "/api/v1/grants", writeToken, `{"entitlement":"tokens","subject":"u","amount":5,"reason":"x","creator":"root"}`, 400, "created_at"},
		{"an unknown field", "POST", "/api/v1/grants", writeToken, `{"entitlement":"tokens","subject":"u","amount":5,"reason":"x","owner":"me"}`, 400, ""},
		{"the same id again", "POST", "/api/v1/grants", writeToken, `{"id":"` + id + `","entitlement":"tokens","subject":"` + user + `","amount":7,"reason":"x"}`, 409, ""},
		{"a list without an entitlement", "GET", "/api/v1/grants?subject=u", readToken, "", 400, "entitlement"},
		{"a list of an unknown entitlement", "GET", "/api/v1/grants?entitlement=gold&subject=u", readToken, "", 404, ""},
		{"a void of an unknown grant", "POST", "/api/v1/grants/nope/void", writeToken, `{"entitlement":"tokens","subject":"u"}`, 404, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var body any
			if tt.body != "" {
				body = tt.body
			}
			got := env.call(t, tt.method, tt.path, tt.token, body)
			if got.status != tt.status || tt.field != "" && got.body["field"] != tt.field {
				t.Errorf("%s %s: %d %s, want %d naming %q", tt.method, tt.path, got.status, got.raw, tt.status, tt.field)
			}
		})
	}
	if n := len(readEvents(t, js)[seen:]); n != 2 {
		t.Errorf("%d events after the refused writes, want still 2", n)
	}

	// The same through the Go client.
	c := &Client{BaseURL: env.url, Token: writeToken, HTTP: env.http}
	res, err := c.CreateGrant(t.Context(), rules.Grant{ID: "topup", Entitlement: "tokens", Subject: user, Amount: 50, Priority: 2, Reason: "bought"})
	if err != nil || res.Grant.ID != "topup" || res.Balance.Remaining != 50 {
		t.Fatalf("CreateGrant = %+v, %v; want topup and 50 left", res, err)
	}
	if b, err := c.Grants(t.Context(), "tokens", user); err != nil || len(b.Grants) != 2 || b.Remaining != 50 {
		t.Fatalf("Grants = %+v, %v; want the voided plan and the top-up", b, err)
	}
	if res, err := c.VoidGrant(t.Context(), "tokens", user, "topup"); err != nil || res.Balance.Remaining != 0 {
		t.Fatalf("VoidGrant = %+v, %v; want nothing left", res, err)
	}
	var ae *Error
	if _, err := c.VoidGrant(t.Context(), "tokens", user, "nope"); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("VoidGrant of an unknown grant: %v, want a 404 *Error", err)
	}
}
