package health_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

var natsSrv *natstest.Server

func TestMain(m *testing.M) { os.Exit(natstest.Main(m, &natsSrv)) }

// source reports a fixed view: Redis in the state it is set to.
type source struct {
	role, instance string
	redis          health.State
}

func (s *source) Role() string     { return s.role }
func (s *source) Instance() string { return s.instance }
func (s *source) Observe(_ context.Context, r *health.Report, _ time.Duration) {
	r.Dependencies[health.Redis] = health.Dependency{State: s.redis}
}

// listed is the condition that ok accepts the reports listed, which it stores in *got unless
// got is nil.
func listed(js jetstream.JetStream, got *[]health.Report, ok func([]health.Report) bool) func(context.Context) error {
	return func(ctx context.Context) error {
		rs, err := health.List(ctx, js)
		if err != nil {
			return err
		}
		if got != nil {
			*got = rs
		}
		if !ok(rs) {
			return fmt.Errorf("reports %+v", rs)
		}
		return nil
	}
}

// TestReporter: a report is listed under its role and instance with a dependency's Since kept
// while its state stays; Close removes it; a process that stops reporting expires.
func TestReporter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := natsSrv.JetStream(t)
	if rs, err := health.List(ctx, js); err != nil || len(rs) != 0 {
		t.Fatalf("List before any report = %v, %v; want none and no error", rs, err)
	}
	cfg := health.Config{Interval: 50 * time.Millisecond}
	chk := health.Start(js, &source{role: health.RoleChecker, instance: "c.1", redis: health.StateOK}, cfg)
	agg := health.Start(js, &source{role: health.RoleAggregator, instance: "a-1", redis: health.StateDown}, cfg)
	var first time.Time
	var rs []health.Report
	if err := poll.Wait(ctx, "both reports, a few intervals on", listed(js, &rs, func(rs []health.Report) bool {
		if len(rs) == 2 && first.IsZero() {
			first = rs[0].Dependencies[health.Redis].Since
		}
		return len(rs) == 2 && rs[0].At.Sub(rs[0].Started) > 3*cfg.Interval
	})); err != nil {
		t.Fatal(err)
	}
	if rs[0].Role != health.RoleChecker || rs[0].Instance != "c.1" || rs[1].Role != health.RoleAggregator {
		t.Errorf("reports %+v: want the checker c.1 first, then the aggregator", rs)
	}
	if got := rs[0].Dependencies[health.Redis]; got.State != health.StateOK || !got.Since.Equal(first) {
		t.Errorf("checker's redis = %+v, want ok since the first report (%v)", got, first)
	}
	if got := rs[1].Down(); len(got) != 1 || got[0] != health.Redis {
		t.Errorf("aggregator's Down() = %v, want [redis]", got)
	}
	if got := health.Key(health.RoleChecker, "c.1*"); got != "checker.c_1_" {
		t.Errorf("Key(checker, c.1*) = %q, want checker.c_1_", got)
	}
	if err := chk.Close(); err != nil {
		t.Fatal(err)
	}
	if err := poll.Wait(ctx, "the aggregator's report alone", listed(js, nil, func(rs []health.Report) bool { return len(rs) == 1 && rs[0].Role == health.RoleAggregator })); err != nil {
		t.Fatal(err)
	}
	if err := agg.Close(); err != nil {
		t.Fatal(err)
	}
	// A process killed leaves its last report, which expires after a few intervals (the
	// bucket's max age, set by the first reporter).
	kv, err := js.KeyValue(ctx, health.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, health.Key(health.RoleChecker, "killed"), []byte(`{"role":"checker","instance":"killed"}`)); err != nil {
		t.Fatal(err)
	}
	if err := poll.Wait(ctx, "the killed process's report alone", listed(js, nil, func(rs []health.Report) bool { return len(rs) == 1 && rs[0].Instance == "killed" })); err != nil {
		t.Fatal(err)
	}
	if err := poll.Wait(ctx, "no report", listed(js, nil, func(rs []health.Report) bool { return len(rs) == 0 })); err != nil {
		t.Fatal(err)
	}
}
