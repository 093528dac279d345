package natstest

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var pkgSrv *Server

func TestMain(m *testing.M) { os.Exit(Main(m, &pkgSrv)) }

// TestCluster: a 3-node cluster holds a 3-replica stream through the kill -9 of a node, and
// the restarted node catches up as a current replica.
func TestCluster(t *testing.T) {
	t.Parallel()
	c, err := StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js := c.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// Each attempt has its own deadline and the message its own id: a publish sent while the
	// killed node was the stream's leader gets no ack (a lost ack is a wait to the deadline, not
	// an error), and its retry must not store the message twice if the first one was kept.
	sent := 0
	publish := func(n int) {
		for range n {
			sent++
			for {
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(actx, "t.x", []byte("x"), jetstream.WithMsgID(strconv.Itoa(sent)))
				cancel()
				if err == nil {
					break
				} else if ctx.Err() != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // a leader election after the kill
			}
		}
	}
	publish(50)
	c.Nodes[0].Stop()
	publish(50)
	if err := c.Nodes[0].Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		current := 0
		for _, r := range info.Cluster.Replicas {
			if r.Current {
				current++
			}
		}
		if info.State.Msgs == 100 && current == 2 { // the leader and two current followers
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("stream after the restart: %d messages, %d current followers (%+v), want 100 and 2", info.State.Msgs, current, info.Cluster)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
