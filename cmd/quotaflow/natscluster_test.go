package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
	"github.com/quotaflow/quotaflow/publisher"
)

// natsClusterRules: /api/* never denies; /w's token bucket takes its 11th check into
// throttled, and frees a unit only after 2.4 h (a fixed window aligned to the clock could end
// during the test, and the recovery transitions would be right).
const natsClusterRules = `
default_tier: free
tiers: {free: {}}
warnings: {enter: 0.5, exit: 0.4}
rules:
  - {id: load, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 1000000, window: 1h}
  - {id: warn, dimension: user, endpoint: /w, algorithm: token_bucket, limit: 10, window: 24h}
`

const natsClusterToken = "nats-cluster-admin-token"

// TestNATSCluster runs two checkers and two aggregators with --stream-replicas 3 on a 3-node
// NATS cluster and kills the node leading the decision stream (kill -9) under load, then starts
// it again. Every answered decision reaches ClickHouse exactly once; an override made during
// the outage reaches both checkers; the warning transitions of a subject driven through its
// limit during the outage are published and stored once each; the stream's leadership moves
// off the dead node and the node comes back as a current replica; the aggregators split the
// partitions evenly again.
func TestNATSCluster(t *testing.T) {
	t.Parallel()
	cl, err := natstest.StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	run := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	db := "ncl_" + run
	dsn := chSrv.DSN(db)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	if out, _, code := runCmd(ctx, []string{"migrate", "--clickhouse-dsn", dsn}, nil); code != 0 {
		t.Fatalf("migrate exit %d: %s", code, out)
	}

	// The aggregators first: they wait for the stream the checkers create.
	var aggURLs []string
	for _, name := range []string{"agg-a", "agg-b"} {
		agg := daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: cl.URL(), ClickHouseDSN: dsn, Listen: "127.0.0.1:0",
			Aggregator: aggregator.Config{Replicas: 3, InstanceID: name, FlushInterval: 200 * time.Millisecond,
				InsertTimeout: 2 * time.Second, PinnedTTL: 3 * time.Second, AckWait: 5 * time.Second, WarningGrace: 100 * time.Millisecond}})
		aggURLs = append(aggURLs, agg.URL())
	}
	rulesPath := writeFile(t, "rules.yaml", natsClusterRules)
	checkers := make([]quotaflowv1connect.RateLimiterClient, 2)
	var bases []string
	for i := range checkers {
		base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: rulesPath, Redis: redisDB(t, 9),
			NATSURL: cl.URL(), Publisher: publisher.Config{Replicas: 3}, InstanceID: "ncl-" + run + "-" + strconv.Itoa(i),
			Admin: writer(natsClusterToken)}).URL()
		bases = append(bases, base)
		checkers[i] = quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, base)
	}

	// Load: two callers, one per checker, until stopped; every answered id is kept.
	var mu sync.Mutex
	ids := map[string]bool{}
	var failed atomic.Int64
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	for w, c := range checkers {
		load.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				resp, err := c.CheckRateLimit(ctx, userCheckAt(fmt.Sprintf("ncl-%d-%d", w, n%40), "/api/x"))
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				ids[resp.Msg.DecisionId] = true
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}

	js := cl.JetStream(t)
	// The node to kill leads the decision stream.
	var leader string
	poll.Until(t, 30*time.Second, "the decision stream's leader", eachWithin(ctx, func(ctx context.Context) error {
		info, err := streamInfo(ctx, js, stream.Name)
		if err != nil {
			return err
		}
		leader = info.Cluster.Leader
		if leader == "" {
			return fmt.Errorf("no leader yet")
		}
		return nil
	}))
	victim := -1
	for i, name := range cl.Names {
		if name == leader {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("stream leader %q is none of %v", leader, cl.Names)
	}
	time.Sleep(time.Second)
	before := answered(&mu, ids)
	cl.Nodes[victim].Stop() // kill -9
	killed := time.Now()

	// During the outage: an override through one checker, and a subject driven past its limit.
	// While the rule store's buckets elect new leaders the admin API answers 503 (unavailable):
	// the operator retries, with the same override id so that a retry cannot add a second one.
	var overrideTries int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		overrideTries++
		_, stderr, code := runCmd(ctx, []string{"override", "set", "--target", bases[0], "--token", natsClusterToken,
			"--id", "ncl-ov-" + run, "--user", "ncl-ov-" + run, "--multiplier", "3", "--duration", "10m",
			"--reason", "during the outage"}, nil)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("override set during the outage: exit %d after %d tries: %s", code, overrideTries, stderr)
		}
	}
	overrideSet := time.Since(killed)
	warnUser := "ncl-warn-" + run
	for i := range 11 { // 5 of 10 used is a warning (enter 0.5); the 11th is denied: throttled
		if _, err := checkers[i%2].CheckRateLimit(ctx, userCheckAt(warnUser, "/w")); err != nil {
			t.Errorf("check %d of %s: %v", i, warnUser, err)
		}
	}
	for i, c := range checkers {
		poll.Until(t, 20*time.Second, fmt.Sprintf("override on checker %d", i), eachWithin(ctx, func(ctx context.Context) error {
			resp, err := c.CheckRateLimit(ctx, userCheckAt("ncl-ov-"+run, "/w"))
			if err != nil {
				return err
			}
			if resp.Msg.Limit != 30 {
				return fmt.Errorf("limit %d, want 30 (10 × 3)", resp.Msg.Limit)
			}
			return nil
		}))
	}
	poll.Until(t, 45*time.Second, "a new stream leader", eachWithin(ctx, func(ctx context.Context) error {
		info, err := streamInfo(ctx, js, stream.Name)
		if err != nil {
			return err
		}
		if info.Cluster.Leader == "" || info.Cluster.Leader == leader {
			return fmt.Errorf("leader %q", info.Cluster.Leader)
		}
		return nil
	}))
	moved := time.Since(killed)
	time.Sleep(time.Until(killed.Add(3 * time.Second)))
	during := answered(&mu, ids) - before
	if err := cl.Nodes[victim].Start(); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	close(stopLoad)
	load.Wait()
	want := answered(&mu, ids)

	// The restarted node is a current replica of the stream and of every partition's consumer.
	poll.Until(t, 30*time.Second, "the restarted node current everywhere", eachWithin(ctx, func(ctx context.Context) error {
		info, err := streamInfo(ctx, js, stream.Name)
		if err != nil {
			return err
		}
		if err := currentReplica(info.Cluster, leader); err != nil {
			return fmt.Errorf("stream: %w", err)
		}
		for p := range stream.Partitions {
			cons, err := js.Consumer(ctx, stream.Name, aggregator.ConsumerName(p))
			if err != nil {
				return err
			}
			ci, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if err := currentReplica(ci.Cluster, leader); err != nil {
				return fmt.Errorf("consumer of partition %d: %w", p, err)
			}
		}
		return nil
	}))

	c, err := chSrv.Conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := func(q string) uint64 {
		var n uint64
		if err := c.QueryRow(ctx, fmt.Sprintf(q, db)).Scan(&n); err != nil {
			return 0
		}
		return n
	}
	stored := false
	defer func() {
		if !stored {
			diagnoseStream(t, js, c, db)
		}
	}()
	poll.Until(t, 60*time.Second, "every decision in ClickHouse", eachWithin(ctx, func(ctx context.Context) error {
		if n := count("SELECT count() FROM %s.decisions WHERE endpoint = '/api/x'"); n < uint64(want) {
			return fmt.Errorf("%d of %d decisions stored", n, want)
		}
		return nil
	}))
	stored = true
	time.Sleep(time.Second) // a duplicate would arrive now
	for _, q := range []string{
		"SELECT count() FROM %s.decisions WHERE endpoint = '/api/x'",
		"SELECT uniqExact(id) FROM %s.decisions WHERE endpoint = '/api/x'",
	} {
		if got := count(q); got != uint64(want) {
			t.Errorf("%s = %d, want the %d answered", fmt.Sprintf(q, db), got, want)
		}
	}

	// Warning transitions: published once each, stored once each.
	var published []string
	poll.Until(t, 30*time.Second, "warn user's transitions published", eachWithin(ctx, func(ctx context.Context) error {
		published = nil
		for _, m := range natstest.Messages(t, js, events.Stream, "quotaflow.warnings.>") {
			var ev struct {
				Subject string `json:"subject"`
				From    string `json:"from"`
				To      string `json:"to"`
			}
			if json.Unmarshal(m.Data(), &ev) == nil && ev.Subject == warnUser {
				published = append(published, ev.From+"→"+ev.To)
			}
		}
		if len(published) < 1 || published[len(published)-1] != "warning→throttled" && published[len(published)-1] != "normal→throttled" {
			return fmt.Errorf("published %v", published)
		}
		return nil
	}))
	if got, want := strings.Join(published, ", "), wantTransitions(t, js, warnUser); got != want {
		t.Errorf("transitions of %s published: %s, want %s once each", warnUser, got, want)
	}
	poll.Until(t, 30*time.Second, "warn user's transitions stored", eachWithin(ctx, func(ctx context.Context) error {
		if n := count("SELECT count() FROM %s.state_transitions WHERE subject = '" + warnUser + "'"); n < 2 {
			return fmt.Errorf("%d stored", n)
		}
		return nil
	}))
	if n := count("SELECT count() FROM %s.state_transitions WHERE subject = '" + warnUser + "'"); n != uint64(len(published)) {
		t.Errorf("%d transitions of %s stored, want the %d published", n, warnUser, len(published))
	}

	// The aggregators share the partitions evenly again.
	defer func() {
		if t.Failed() {
			logGoroutines(t, "quotaflow/aggregator.")
		}
	}()
	poll.Until(t, 30*time.Second, "partitions split evenly", eachWithin(ctx, func(ctx context.Context) error {
		var owned []int
		for _, u := range aggURLs {
			n, err := ownedPartitions(u)
			if err != nil {
				return err
			}
			owned = append(owned, n)
		}
		if owned[0]+owned[1] != stream.Partitions || owned[0] != owned[1] {
			return fmt.Errorf("owned %v", owned)
		}
		return nil
	}))
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	if info, err := streamInfo(sctx, js, stream.Name); err == nil && want > 0 {
		t.Logf("the decision stream holds %d bytes in %d messages for %d decisions: %.0f bytes per decision per replica",
			info.State.Bytes, info.State.Msgs, want, float64(info.State.Bytes)/float64(want))
	}
	scancel()
	t.Logf("killed %s (the stream leader); new leader after %v; override set %v after the kill (%d tries); %d checks answered in all, %d in the 3 s after the kill, %d failed",
		leader, moved.Round(time.Millisecond), overrideSet.Round(time.Millisecond), overrideTries, want, during, failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d checks failed: a NATS outage must not fail checks", failed.Load())
	}
}

// userCheckAt is a check of user at endpoint.
func userCheckAt(user, endpoint string) *connect.Request[quotaflowv1.CheckRateLimitRequest] {
	return connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: endpoint})
}

func answered(mu *sync.Mutex, ids map[string]bool) int {
	mu.Lock()
	defer mu.Unlock()
	return len(ids)
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil {
		return nil, fmt.Errorf("stream %s has no cluster information", name)
	}
	return info, nil
}

// currentReplica reports why node is not the leader or a current replica in c.
func currentReplica(c *jetstream.ClusterInfo, node string) error {
	if c == nil {
		return fmt.Errorf("no cluster information")
	}
	if c.Leader == node {
		return nil
	}
	for _, r := range c.Replicas {
		if r.Name == node && r.Current {
			return nil
		}
	}
	return fmt.Errorf("%s is not a current replica (leader %s, replicas %+v)", node, c.Leader, c.Replicas)
}

// eachWithin gives each look of cond a context of its own that ends after 3 s: a request in
// flight when its NATS server dies is never answered, and would otherwise wait for the test's
// deadline.
func eachWithin(ctx context.Context, cond func(ctx context.Context) error) func() error {
	return func() error {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return cond(actx)
	}
}

// ownedPartitions reads an aggregator's quotaflow_aggregator_partitions_owned gauge.
func ownedPartitions(base string) (int, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "quotaflow_aggregator_partitions_owned") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			return int(v), err
		}
	}
	return 0, fmt.Errorf("no partitions gauge in %s/metrics", base)
}

// TestStreamReplicasFlag: replicas a NATS server outside a cluster cannot hold stop the checker
// and the aggregator at start, with an error naming the flag (exit status 2).
func TestStreamReplicasFlag(t *testing.T) {
	t.Parallel()
	rulesPath := writeFile(t, "rules.yaml", natsClusterRules)
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"checker", []string{"checker", "--listen", "127.0.0.1:0", "--rules", rulesPath, "--redis-url", redisSrv.URL(9),
			"--nats-url", natsSrv.URL, "--spool-dir", t.TempDir(), "--stream-replicas", "3"}},
		{"aggregator", []string{"aggregator", "--listen", "127.0.0.1:0", "--nats-url", natsSrv.URL,
			"--clickhouse-dsn", chSrv.DSN("replicas_flag"), "--stream-replicas", "3"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, stderr, code := runCmd(ctx, tt.args, nil)
			if code != 2 || !strings.Contains(stderr, "--stream-replicas: 3 replicas: the NATS servers cannot hold them") ||
				!strings.Contains(stderr, "is not in a cluster") {
				t.Errorf("%s with 3 replicas on a lone server: exit %d, stderr %q; want 2 and the flag named", tt.name, code, stderr)
			}
		})
	}
}

// diagnoseStream logs, per partition, what the stream holds, what its consumer has delivered
// and acked, and what ClickHouse stored: where decisions stopped on their way.
func diagnoseStream(t *testing.T, js jetstream.JetStream, c driver.Conn, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := map[string]int{}
	for _, m := range natstest.Messages(t, js, stream.Name) {
		var b quotaflowv1.DecisionBatch
		if proto.Unmarshal(m.Data(), &b) == nil {
			held[m.Subject()] += len(b.Decisions)
		}
	}
	for p := range stream.Partitions {
		subject := stream.Subject(stream.SubjectPrefix, p)
		line := fmt.Sprintf("partition %d: stream holds %d decisions", p, held[subject])
		if cons, err := js.Consumer(ctx, stream.Name, aggregator.ConsumerName(p)); err == nil {
			if ci, err := cons.Info(ctx); err == nil {
				line += fmt.Sprintf("; consumer delivered %d, ack floor %d, pending %d, ack pending %d, redelivered %d, pinned %v",
					ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.PriorityGroups)
			}
		}
		var n uint64
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.decisions WHERE partition = %d", db, p)).Scan(&n); err == nil {
			line += fmt.Sprintf("; ClickHouse holds %d", n)
		}
		var msgs uint64
		if err := c.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.ingested_messages WHERE partition = %d", db, p)).Scan(&msgs); err == nil {
			line += fmt.Sprintf(" in %d messages", msgs)
		}
		t.Log(line)
	}
}

// wantTransitions returns the transitions the aggregator must publish for user's checks (one
// warning entered at 5 of 10, then a denial), from the order the decision stream holds them
// in. The publisher keeps a partition's order except when a batch fails while a later one,
// already sent, is stored (publisher's package doc): during the leader's kill the warning's
// decision can land after the denial, and a decision older than the last transition changes
// nothing (docs/warnings.md, "Late decisions"), so the subject goes from normal to throttled.
func wantTransitions(t *testing.T, js jetstream.JetStream, user string) string {
	entered, denied := 0, 0 // stream positions, from 1
	pos := 0
	for _, m := range natstest.Messages(t, js, stream.Name) {
		var b quotaflowv1.DecisionBatch
		if proto.Unmarshal(m.Data(), &b) != nil {
			continue
		}
		for _, d := range b.Decisions {
			for _, l := range d.Limits {
				if l.Identifier != user {
					continue
				}
				pos++
				switch {
				case !l.Allowed && denied == 0:
					denied = pos
				case l.Allowed && l.CurrentCount*2 >= l.Limit && entered == 0:
					entered = pos
				}
			}
		}
	}
	if entered != 0 && entered < denied {
		return "normal→warning, warning→throttled"
	}
	t.Logf("%s's warning decision is stored after its denial (positions %d, %d): no warning state", user, entered, denied)
	return "normal→throttled"
}

// logGoroutines logs the stacks of this process's goroutines that run code of pkg: on a failure,
// where the aggregators in process are stuck.
func logGoroutines(t *testing.T, pkg string) {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, pkg) {
			t.Log(g)
		}
	}
}
