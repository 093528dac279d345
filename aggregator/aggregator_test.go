package aggregator_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

var (
	chSrv   *clickhousetest.Server
	natsSrv *natstest.Server
	dbSeq   atomic.Int64
)

func TestMain(m *testing.M) { os.Exit(natstest.Main(withCH{m}, &natsSrv)) }

type withCH struct{ m *testing.M }

func (w withCH) Run() int { return clickhousetest.Main(w.m, &chSrv) }

const partitions = 4

// tb is what the helpers need of a test or benchmark.
type tb interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
	Errorf(string, ...any)
	Cleanup(func())
}

// env is one test's stream (own subjects) and database on the shared servers.
type env struct {
	t      tb
	js     jetstream.JetStream
	ch     driver.Conn
	stream string
	prefix string
	db     string
	seq    atomic.Int64 // decisions published
	mu     sync.Mutex
	ids    int
	tier   string // the tier of this test's warning events
}

func newEnv(t tb) *env {
	t.Helper()
	nc, err := natsSrv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return newEnvOn(t, js)
}

// newEnvOn is newEnv on the NATS server of js: one of the test's own, for a test that needs
// the rule store (fixed bucket names).
func newEnvOn(t tb, js jetstream.JetStream) *env {
	t.Helper()
	ch, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	n := dbSeq.Add(1)
	e := &env{t: t, js: js, ch: ch, stream: fmt.Sprintf("AGGTEST_%d", n), prefix: fmt.Sprintf("aggtest.%d", n), db: fmt.Sprintf("aggtest_%d_%d", os.Getpid(), n), tier: fmt.Sprintf("wt%d_%d", os.Getpid(), n)}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: e.stream, Subjects: []string{e.prefix + ".>"}, Storage: jetstream.FileStorage, Duplicates: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) config(id string) aggregator.Config {
	return aggregator.Config{
		Stream: e.stream, SubjectPrefix: e.prefix, Partitions: partitions, Database: e.db,
		InstanceID: id, FlushInterval: 50 * time.Millisecond, InsertTimeout: time.Second,
		PinnedTTL: 2 * time.Second, AckWait: 3 * time.Second, Heartbeat: 200 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		RetentionInterval: -1, BatchRows: 2000, Logger: testLogger(id),
		// Each test stores only its own events: its tier's warnings.
		EventsConsumer: "events-" + e.stream, EventsSubjects: []string{events.WarningsPrefix + "." + e.tier + ".>"},
		WarningGrace: 100 * time.Millisecond,
	}
}

// start runs an aggregator until the returned stop is called (or the test ends).
func (e *env) start(id string) (*aggregator.Aggregator, func()) {
	return e.startWith(e.config(id))
}

func (e *env) startWith(cfg aggregator.Config) (*aggregator.Aggregator, func()) {
	e.t.Helper()
	return e.startOn(e.ch, cfg)
}

// startOn is startWith writing to ClickHouse through ch.
func (e *env) startOn(ch driver.Conn, cfg aggregator.Config) (*aggregator.Aggregator, func()) {
	e.t.Helper()
	id := cfg.InstanceID
	a, err := aggregator.New(e.js, ch, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("aggregator %s: %v", id, err)
			}
		})
	}
	e.t.Cleanup(stop)
	return a, stop
}

// publish puts n decisions on the stream in batches of size per message, spread over the
// partitions, each message with a Nats-Msg-Id as the publisher sends.
func (e *env) publish(n, size int) { e.publishEdited(n, size, nil) }

// publishEdited is publish with edit applied to every decision before it is sent.
func (e *env) publishEdited(n, size int, edit func(*quotaflowv1.Decision)) {
	e.t.Helper()
	ctx := context.Background()
	for sent := 0; sent < n; {
		k := min(size, n-sent)
		e.mu.Lock()
		e.ids++
		batchNo := e.ids
		e.mu.Unlock()
		p := batchNo % partitions
		var b quotaflowv1.DecisionBatch
		for i := 0; i < k; i++ {
			id := e.seq.Add(1)
			b.Decisions = append(b.Decisions, &quotaflowv1.Decision{
				Id: fmt.Sprintf("test-%d", id), CheckerId: "test", TimeUs: time.Now().UnixMicro(),
				Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: fmt.Sprintf("u%d", p)},
				Tier:    []string{"free", "pro"}[id%2], Endpoint: "/orders", RuleId: "r1", Algorithm: "token_bucket",
				Cost: 1, Allowed: id%3 != 0, Limit: 10, State: quotaflowv1.State_STATE_NORMAL,
				Limits: []*quotaflowv1.LimitStatus{{RuleId: "r1", Dimension: quotaflowv1.Dimension_DIMENSION_USER, Limit: 10, Allowed: id%3 != 0}},
			})
		}
		if edit != nil {
			for _, d := range b.Decisions {
				edit(d)
			}
		}
		data, err := proto.Marshal(&b)
		if err != nil {
			e.t.Fatal(err)
		}
		msg := &nats.Msg{Subject: fmt.Sprintf("%s.%d", e.prefix, p), Data: data, Header: nats.Header{}}
		if _, err := e.js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("test.%d", batchNo))); err != nil {
			e.t.Fatal(err)
		}
		sent += k
	}
}

func (e *env) count(q string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.ch.QueryRow(context.Background(), fmt.Sprintf(q, e.db)).Scan(&n); err != nil {
		return 0 // not there yet (database being created)
	}
	return n
}

// waitStored waits until decisions holds want rows, then checks the rollups and that no
// decision is there twice.
func (e *env) waitStored(want uint64) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for e.count("SELECT count() FROM %s.decisions") != want {
		if time.Now().After(deadline) {
			e.t.Fatalf("decisions holds %d rows after 60s, want %d", e.count("SELECT count() FROM %s.decisions"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The rollups' rows become visible after the table's (a view's insert follows the
	// table's), a while later on a loaded machine: waited for, up to a deadline.
	for e.count("SELECT sum(requests) FROM %s.usage_minute") != want || e.count("SELECT sum(requests) FROM %s.usage_hour") != want ||
		e.count("SELECT sum(requests) FROM %s.usage_day") != want {
		if time.Now().After(deadline) {
			break // reported below
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Settle: nothing more may arrive (a duplicate would).
	time.Sleep(300 * time.Millisecond)
	for _, q := range []string{
		"SELECT count() FROM %s.decisions",
		"SELECT uniqExact(id) FROM %s.decisions",
		"SELECT sum(requests) FROM %s.usage_minute",
		"SELECT sum(requests) FROM %s.usage_hour",
		"SELECT sum(requests) FROM %s.usage_day",
	} {
		if got := e.count(q); got != want {
			e.t.Errorf("%s = %d, want %d", fmt.Sprintf(q, e.db), got, want)
		}
	}
	if got, wantDenied := e.count("SELECT sum(denied_requests) FROM %s.usage_minute"), e.count("SELECT countIf(allowed = 0) FROM %s.decisions"); got != wantDenied {
		e.t.Errorf("usage_minute denied = %d, want %d as in decisions", got, wantDenied)
	}
}

// TestStoresEveryDecisionOnce: N decisions published → N rows, rollups sum to N.
func TestStoresEveryDecisionOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, _ := e.start("solo")
	e.publish(5000, 100)
	e.waitStored(5000)
	if s := a.Stats(); s.Inserted != 5000 || s.Owned != partitions {
		t.Errorf("stats %+v, want 5000 inserted, %d partitions owned", s, partitions)
	}
}

// TestRedeliveryIsSkipped: consumers deleted and recreated redeliver the whole stream; the
// stored progress makes the second aggregator skip all of it.
func TestRedeliveryIsSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, stop := e.start("first")
	e.publish(3000, 50)
	e.waitStored(3000)
	stop()
	for p := 0; p < partitions; p++ {
		if err := e.js.DeleteConsumer(context.Background(), e.stream, aggregator.ConsumerName(p)); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := e.start("second")
	e.publish(1000, 50)
	e.waitStored(4000)
	if s := a.Stats(); s.Skipped != 3000 || s.Inserted != 1000 {
		t.Errorf("second aggregator %+v, want 3000 skipped and 1000 inserted", s)
	}
}

// TestScaleOutAndFailover: two aggregators split the partitions; when one stops, the other
// takes all of them and nothing is lost or doubled.
func TestScaleOutAndFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, stopA := e.start("agg-a")
	b, _ := e.start("agg-b")
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Owned+b.Stats().Owned != partitions || a.Stats().Owned == 0 || b.Stats().Owned == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("owned partitions a=%d b=%d, want %d split between both", a.Stats().Owned, b.Stats().Owned, partitions)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The leader (which writes the policies' overrides) is one of them: the first by name, as
	// of each one's last heartbeat.
	for !a.Leader() || b.Leader() {
		if time.Now().After(deadline) {
			t.Fatalf("Leader() a=%v b=%v, want agg-a only", a.Leader(), b.Leader())
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.publish(2000, 20)
	e.waitStored(2000)
	if a.Stats().Inserted == 0 || b.Stats().Inserted == 0 {
		t.Errorf("inserted a=%d b=%d, want both to have worked", a.Stats().Inserted, b.Stats().Inserted)
	}
	stopA()
	e.publish(2000, 20)
	e.waitStored(4000)
	if got := b.Stats().Owned; got != partitions {
		t.Errorf("after a stopped b owns %d partitions, want %d", got, partitions)
	}
	for deadline := time.Now().Add(10 * time.Second); !b.Leader(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("after a stopped, b is not the leader")
		}
	}
}

// TestClickHouseOutage is in outage_test.go: it stops the shared server.

func testLogger(id string) *slog.Logger {
	if os.Getenv("QF_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("agg", id)
}
