package checker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
)

// An engine decides checks from the rules and the buckets in Redis; the third order of the
// hour is denied, with the wait before the bucket allows it again. A reset empties the user's
// bucket.
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
	ctx := context.Background()

	alice := checker.Subject{Dimension: rules.DimensionUser, ID: "alice-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	q := &checker.Query{Subjects: []checker.Subject{alice}, Endpoint: "/orders"} // Cost 0 means 1
	for range 3 {
		out, err := engine.Check(ctx, q)
		if err != nil {
			log.Fatal(err)
		}
		l := out.DecidingLimit()
		fmt.Printf("allowed=%v rule=%s remaining=%d/%d state=%s waits=%v\n",
			out.Allowed, l.Rule.ID, l.Result.Remaining, l.Limit.Capacity(), out.State(), l.Result.RetryAfter > 0)
	}
	n, ids, err := engine.Reset(ctx, checker.ResetRequest{Subject: alice})
	if err != nil {
		log.Fatal(err)
	}
	out, err := engine.Check(ctx, q)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reset %d bucket of %v; allowed=%v\n", n, ids, out.Allowed)
	// Output:
	// allowed=true rule=orders remaining=1/2 state=normal waits=false
	// allowed=true rule=orders remaining=0/2 state=warning waits=false
	// allowed=false rule=orders remaining=0/2 state=throttled waits=true
	// reset 1 bucket of [orders]; allowed=true
}

// A query that breaks a rule is refused before anything is charged, with a FieldError naming
// the field, which transports answer with InvalidArgument or HTTP 400.
func ExampleFieldError() {
	set, err := rules.Parse([]byte("rules:\n  - {id: orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 2, window: 1h}\n"))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: checker.RedisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	engine := checker.New(checker.Config{Redis: rdb, Rules: set})
	defer engine.Close()
	_, err = engine.Check(context.Background(), &checker.Query{
		Subjects: []checker.Subject{{Dimension: rules.DimensionUser, ID: "bob"}, {Dimension: rules.DimensionIP}}, Endpoint: "/orders"})
	var fe *checker.FieldError
	fmt.Println(errors.As(err, &fe), fe.Field)
	fmt.Println(err)
	// Output:
	// true subjects[1].identifier
	// subjects[1].identifier: required
}

// A Replay decides recorded checks again under other rules, at the instants they were decided,
// without Redis: here three orders of one second, under a limit lowered to 2 per hour.
func ExampleReplay() {
	set, err := rules.Parse([]byte(`
rules:
  - {id: orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 2, window: 1h}
`))
	if err != nil {
		log.Fatal(err)
	}
	replay := checker.NewReplay(set, 0)
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	q := &checker.Query{Endpoint: "/orders", Subjects: []checker.Subject{{Dimension: rules.DimensionUser, ID: "alice"}}}
	for i := range 3 {
		out, err := replay.Check(at.Add(time.Duration(i)*time.Second), q, true)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Allowed, out.DecidingLimit().Result.Remaining)
	}
	// Output:
	// true 1
	// true 0
	// false 0
}
