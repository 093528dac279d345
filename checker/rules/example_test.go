package rules_test

import (
	"fmt"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// Parse validates a whole rules document and compiles it; Match finds the rules that apply to
// a subject's tier and an endpoint, the tier's own rules replacing the general ones.
func ExampleParse() {
	set, err := rules.Parse([]byte(`
default_tier: free
tiers: {free: {}, pro: {}}
users:
  alice: {tier: pro}
rules:
  - {id: orders, dimension: user, endpoint: /orders/*, algorithm: token_bucket, limit: 10, window: 1m}
  - {id: orders-pro, dimension: user, endpoint: /orders/*, tier: pro, algorithm: token_bucket, limit: 100, window: 1m, burst: 200}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, user := range []string{"bob", "alice"} {
		tier := set.TierOf(user)
		for _, r := range set.Match(rules.DimensionUser, tier, "/orders/42") {
			fmt.Printf("%s (%s): %s, %d per %s, %s\n", user, tier, r.ID, r.Limit, r.Window, r.Algorithm)
		}
	}
	// Output:
	// bob (free): orders, 10 per 1m0s, token_bucket
	// alice (pro): orders-pro, 100 per 1m0s, token_bucket
}

// A document with problems is refused whole, every problem named by line, rule and field.
func ExampleParse_invalid() {
	_, err := rules.Parse([]byte(`
rules:
  - {id: orders, dimension: user, endpoint: orders, algorithm: token_bucket, limit: 0, window: 1m}
`))
	fmt.Println(err)
	// Output:
	// 2 problems:
	//   line 3: rule "orders" (rules[0]): endpoint: "orders" must start with "/" (or be "*")
	//   line 3: rule "orders" (rules[0]): limit: want a whole number from 1 to 1000000000, got "0" (0 only for a fixed_window)
}
