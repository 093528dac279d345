package publisher_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/publisher"
)

// A Client takes decisions off the check's path and publishes them in batches to the decision
// stream, spooling them on disk while NATS is unreachable; Close drains both.
func Example() {
	nc, err := nats.Connect(publisher.NATSURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	spool, err := os.MkdirTemp("", "quotaflow-example-spool")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(spool)
	pub, err := publisher.New(nc, publisher.Config{Stream: "EXAMPLE", SubjectPrefix: "example.decisions", SpoolDir: spool})
	if err != nil {
		log.Fatal(err)
	}
	for i := range 3 {
		pub.PublishDecision(&quotaflowv1.Decision{
			Id:      fmt.Sprintf("example-%d", i),
			Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "alice"},
			Allowed: i < 2,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub.Close(ctx); err != nil {
		log.Fatal(err)
	}
	st := pub.Stats()
	fmt.Println("in the stream:", st.Published+st.Replayed, "lost:", st.Dropped)
	// Output:
	// in the stream: 3 lost: 0
}
