package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
	"github.com/quotaflow/quotaflow/publisher"
)

const pipelineRules = `rules:
- {id: user-min, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 5, window: 1h}
- {id: ip-sec, dimension: ip, endpoint: "*", algorithm: gcra, limit: 1000000, window: 1s, shadow: true}
`

// checkerProc is a checker of the pipeline tests, in process, publishing to NATS.
type checkerProc struct {
	url    string
	client quotaflowv1connect.RateLimiterClient
	d      *daemon.Checker
	log    *bytes.Buffer
}

// startChecker starts a checker of pipelineRules publishing to natsURL with instance's name,
// its spool in spoolDir, changed by each of opts.
func startChecker(t *testing.T, instance, natsURL, spoolDir string, opts ...func(*daemon.CheckerConfig)) *checkerProc {
	t.Helper()
	p := &checkerProc{log: &bytes.Buffer{}}
	cfg := daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", pipelineRules), Redis: redisDB(t, 5),
		NATSURL: natsURL, Publisher: publisher.Config{SpoolDir: spoolDir}, InstanceID: instance,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{new(sync.Mutex), p.log}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	for _, o := range opts {
		o(&cfg)
	}
	p.d = daemontest.Checker(t, cfg)
	p.url = p.d.URL()
	p.client = quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, p.url)
	return p
}

// stop is SIGTERM: the checker stops taking checks and drains its decisions.
func (p *checkerProc) stop() error { return p.d.Close() }

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// String is what was written so far.
func (l lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// streamDecisions reads every decision of the checkers started with --instance-id instance.
func streamDecisions(t *testing.T, natsURL, instance string) []*quotaflowv1.Decision {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, "QUOTAFLOW_DECISIONS")
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*quotaflowv1.Decision
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			var b quotaflowv1.DecisionBatch
			if err := proto.Unmarshal(msg.Data(), &b); err != nil {
				t.Fatalf("message %s: %v", msg.Subject(), err)
			}
			for _, d := range b.Decisions {
				if strings.HasPrefix(d.CheckerId, instance+"-") {
					out = append(out, d)
				}
			}
		}
		if n == 0 {
			t.Fatalf("read %d of %d messages, then nothing", read, info.State.Msgs)
		}
		read += uint64(n)
	}
	return out
}

func userCheck(user string) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
	return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{Endpoint: "/api/items", Subjects: []*quotaflowv1.Subject{
		{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user},
		{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: "10.0.0.1"}}})
}

// TestDecisionStream: N checks → exactly N decision events in the stream, each matching the
// response it was returned with.
func TestDecisionStream(t *testing.T) {
	t.Parallel()
	instance := "stream-" + time.Now().Format("150405000")
	p := startChecker(t, instance, natsSrv.URL, t.TempDir())
	responses := map[string]*quotaflowv1.CheckRateLimitResponse{}
	for i := 0; i < 300; i++ {
		resp, err := p.client.CheckRateLimit(context.Background(), userCheck(fmt.Sprintf("%s-u%d", instance, i%40)))
		if err != nil {
			t.Fatal(err)
		}
		responses[resp.Msg.DecisionId] = resp.Msg
	}
	if err := p.stop(); err != nil {
		t.Fatalf("checker shutdown: %v", err)
	}
	events := streamDecisions(t, natsSrv.URL, instance)
	if len(events) != len(responses) {
		t.Fatalf("%d events in the stream for %d checks, want one each", len(events), len(responses))
	}
	denied := 0
	for _, d := range events {
		r := responses[d.Id]
		if r == nil {
			t.Fatalf("event %s matches no response", d.Id)
		}
		// A denial answered from the over-limit cache lists only the cached limit; every other
		// decision lists the user limit and the shadow IP limit.
		wantLimits := 2
		if !r.Allowed && len(r.Limits) == 1 {
			wantLimits = 1
		}
		if d.Allowed != r.Allowed || d.RuleId != r.RuleId || d.Remaining != r.Remaining || d.State != r.State ||
			d.Subject.GetIdentifier() != r.Limits[0].Identifier || len(d.Limits) != len(r.Limits) || len(d.Limits) != wantLimits ||
			d.Limits[0].Allowed != r.Limits[0].Allowed || (wantLimits == 2 && !d.Limits[1].Shadow) {
			t.Errorf("event %v does not match response %v", d, r)
		}
		if !d.Allowed {
			denied++
		}
		delete(responses, d.Id)
	}
	if denied != 300-40*5 {
		t.Errorf("%d denials in the stream, want %d", denied, 300-40*5)
	}
}

// TestNATSOutage kills a separate nats-server process under load and restarts it: checks keep
// their latency, and the stream ends with every decision exactly once.
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	ns, err := natstest.StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	instance := "outage-" + time.Now().Format("150405000")
	p := startChecker(t, instance, ns.URL, t.TempDir())

	var mu sync.Mutex
	ids := map[string]bool{}
	latencies := map[string][]time.Duration{}
	phase := "before"
	load := func(ctx context.Context, worker int) {
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			resp, err := p.client.CheckRateLimit(context.Background(), userCheck(fmt.Sprintf("%s-w%d-%d", instance, worker, i%50)))
			d := time.Since(start)
			if err != nil {
				t.Errorf("check: %v", err)
				return
			}
			mu.Lock()
			ids[resp.Msg.DecisionId] = true
			latencies[phase] = append(latencies[phase], d)
			mu.Unlock()
		}
	}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); load(ctx, w) }()
	}
	setPhase := func(s string, d time.Duration) {
		mu.Lock()
		phase = s
		mu.Unlock()
		time.Sleep(d)
	}
	setPhase("before", 300*time.Millisecond)
	ns.Stop()
	setPhase("outage", 700*time.Millisecond)
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	setPhase("after", 500*time.Millisecond)
	stopLoad()
	wg.Wait()
	if err := p.stop(); err != nil {
		t.Fatalf("checker shutdown: %v\n%s", err, p.log)
	}

	p99 := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		if len(ds) == 0 {
			return 0
		}
		return ds[len(ds)*99/100]
	}
	before, outage := p99(latencies["before"]), p99(latencies["outage"])
	t.Logf("checks: %d before, %d during, %d after the outage; p99 %v before, %v during", len(latencies["before"]),
		len(latencies["outage"]), len(latencies["after"]), before, outage)
	if len(latencies["outage"]) == 0 {
		t.Fatal("no check completed during the outage")
	}
	// Publishing never waits for NATS: a check that did would take the ack timeout (seconds).
	if limit := 10*before + 100*time.Millisecond; outage > limit {
		t.Errorf("p99 during the outage %v, want within %v of the normal %v", outage, limit, before)
	}

	events := streamDecisions(t, ns.URL, instance)
	seen := map[string]bool{}
	for _, d := range events {
		if seen[d.Id] {
			t.Errorf("decision %s is in the stream twice", d.Id)
		}
		seen[d.Id] = true
		if !ids[d.Id] {
			t.Errorf("decision %s was never answered", d.Id)
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%d of %d decisions in the stream after the outage, want all", len(seen), len(ids))
	}
}

// TestSpoolAcrossRestart: decisions spooled while NATS is down survive a checker restart and are
// published by the next run.
func TestSpoolAcrossRestart(t *testing.T) {
	t.Parallel()
	ns, err := natstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ns.Stop() // NATS is down for the first run
	instance := "spool-" + time.Now().Format("150405000")
	spool := t.TempDir()
	first := startChecker(t, instance, ns.URL, spool, func(c *daemon.CheckerConfig) { c.ShutdownTimeout = 300 * time.Millisecond })
	ids := map[string]bool{}
	for i := 0; i < 200; i++ {
		resp, err := first.client.CheckRateLimit(context.Background(), userCheck(fmt.Sprintf("%s-u%d", instance, i)))
		if err != nil {
			t.Fatal(err)
		}
		ids[resp.Msg.DecisionId] = true
	}
	if err := first.stop(); err == nil {
		t.Error("shutdown with NATS down and a full spool: nil error, want the drain to report what is left")
	}
	if entries, _ := os.ReadDir(spool); len(entries) == 0 {
		t.Fatal("spool folder is empty after a run with NATS down")
	}

	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	second := startChecker(t, instance, ns.URL, spool)
	if err := second.stop(); err != nil {
		t.Fatalf("second run's shutdown: %v\n%s", err, second.log)
	}
	events := streamDecisions(t, ns.URL, instance)
	got := map[string]bool{}
	for _, d := range events {
		got[d.Id] = true
	}
	if len(events) != len(ids) || len(got) != len(ids) {
		t.Errorf("%d events (%d distinct) after the restart, want the %d spooled decisions", len(events), len(got), len(ids))
	}
}
