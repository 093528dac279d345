package aggregator_test

import (
	"testing"
	"time"
)

// TestClickHouseOutage stops ClickHouse (kill -9) under load and restarts it: the aggregator
// holds its acks, backs off, and catches up to exactly N. Not parallel: it stops the shared
// server (parallel tests start after it).
func TestClickHouseOutage(t *testing.T) {
	e := newEnv(t)
	a, _ := e.start("outage")
	e.publish(2000, 40)
	e.waitStored(2000)

	chSrv.Stop()
	e.publish(3000, 40)                // published while ClickHouse is down
	time.Sleep(500 * time.Millisecond) // let inserts fail and back off
	if s := a.Stats(); s.ClickHouseErrors == 0 {
		t.Errorf("no ClickHouse error counted while it was down: %+v", s)
	}
	if s := a.Stats(); s.Lag == 0 {
		// The lag is measured every second.
		time.Sleep(1200 * time.Millisecond)
		if s = a.Stats(); s.Lag == 0 {
			t.Errorf("consumer lag 0 with ClickHouse down: %+v", s)
		}
	}
	if err := chSrv.Start(); err != nil {
		t.Fatal(err)
	}
	e.publish(1000, 40)
	e.waitStored(6000)
}
