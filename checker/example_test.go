package checker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/instance"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// An engine decides checks from the rules and the buckets in Redis; the third order of the
// hour is denied, with the wait before the bucket allows it again.
func Example() {
	set, err := rules.Parse([]byte(`
rules:
  - {id: orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 2, window: 1h}
`))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: checker.RedisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	engine := checker.New(checker.Config{Redis: rdb, Rules: set})
	defer engine.Close()

	user := "example-" + instance.NewID()
	q := &checker.Query{Subjects: []checker.Subject{{Dimension: rules.DimensionUser, ID: user}}, Endpoint: "/orders", Cost: 1}
	for range 3 {
		out, err := engine.Check(context.Background(), q)
		if err != nil {
			log.Fatal(err)
		}
		l := out.DecidingLimit()
		fmt.Printf("allowed=%v rule=%s remaining=%d waits=%v\n", out.Allowed, l.Rule.ID, l.Result.Remaining, l.Result.RetryAfter > 0)
	}
	// Output:
	// allowed=true rule=orders remaining=1 waits=false
	// allowed=true rule=orders remaining=0 waits=false
	// allowed=false rule=orders remaining=0 waits=true
}

// NewCheckQuery validates a CheckRateLimit request: a broken one is a FieldError naming the
// field, which transports answer with InvalidArgument or HTTP 400.
func ExampleNewCheckQuery() {
	_, err := checker.NewCheckQuery(&quotaflowv1.CheckRateLimitRequest{
		Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/orders", Cost: -1,
	}, time.Now())
	fmt.Println(err)
	// Output:
	// identifier: required
}
