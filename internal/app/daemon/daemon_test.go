package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
	"github.com/quotaflow/quotaflow/publisher"
	"github.com/quotaflow/quotaflow/schema"
)

var (
	redisSrv *redistest.Server
	natsSrv  *natstest.Server
)

// Frames of the goroutines a daemon owns through its parts: a leaked one is a part its Close
// (or a failed start) did not release.
var owned = []string{
	"bucket.(*batcher).loop(", // the engine's Redis batching
	"nats.(*Conn).readLoop(",  // a NATS connection
	"publisher.(*Client).",    // the publisher's loops
}

func TestMain(m *testing.M) { os.Exit(natstest.Main(withRedis{m}, &natsSrv)) }

type withRedis struct{ m *testing.M }

func (w withRedis) Run() int {
	code := redistest.Main(w.m, &redisSrv)
	for _, frame := range owned {
		if n := proctest.Goroutines(frame); code == 0 && n > 0 {
			fmt.Fprintf(os.Stderr, "daemon: %d goroutines in %s still running after the tests: a daemon was not released\n", n, frame)
			code = 1
		}
	}
	return code
}

const testRules = "rules:\n- {id: two, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 2, window: 1h}\n"

func rulesFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(testRules), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func redisClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: redisSrv.Addr, DB: 1, ContextTimeoutEnabled: true})
}

// taken returns an address something already listens on, for the test's duration.
func taken(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// closedAddr returns an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return proctest.Addr(port)
}

// TestStartCheckerFailureReleases: whichever step of the start fails, StartChecker returns an
// error saying what failed and has released everything it acquired: the Redis client given to
// it, its NATS connection, its publisher and its engine.
func TestStartCheckerFailureReleases(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(t *testing.T) daemon.CheckerConfig
		want    string
		wantErr any // an error type errors.As must find, or nil
	}{
		{"no rules", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{}
		}, "no rules", nil},
		{"missing rules file", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{RulesFile: filepath.Join(t.TempDir(), "none.yaml")}
		}, "none.yaml", nil},
		{"port taken", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{RulesFile: rulesFile(t), NATSURL: natsSrv.URL, Listen: taken(t)}
		}, "listen", nil},
		{"metrics port taken", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{RulesFile: rulesFile(t), NATSURL: natsSrv.URL, MetricsListen: taken(t)}
		}, "metrics listen", nil},
		{"debug port taken", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{RulesFile: rulesFile(t), NATSURL: natsSrv.URL, DebugListen: taken(t)}
		}, "debug listen", nil},
		{"more replicas than NATS servers", func(t *testing.T) daemon.CheckerConfig {
			return daemon.CheckerConfig{RulesFile: rulesFile(t), NATSURL: natsSrv.URL, Publisher: publisher.Config{Replicas: 3}}
		}, "replicas", new(*broker.ReplicasError)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { // not parallel: the goroutine counts are the process's
			cfg := tt.cfg(t)
			rdb := redisClient()
			cfg.Redis, cfg.Logger = rdb, daemontest.Logger()
			cfg.Publisher.SpoolDir = t.TempDir()
			if cfg.Listen == "" {
				cfg.Listen = "127.0.0.1:0"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			d, err := daemon.StartChecker(ctx, cfg)
			if err == nil {
				d.Close()
				t.Fatalf("StartChecker = nil error, want one containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("StartChecker error = %q, want it to contain %q", err, tt.want)
			}
			if tt.wantErr != nil && !errors.As(err, tt.wantErr) {
				t.Errorf("StartChecker error = %v, want it to wrap %T", err, tt.wantErr)
			}
			if err := rdb.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
				t.Errorf("Redis client after a failed start: Ping = %v, want %v (released)", err, redis.ErrClosed)
			}
			assertReleased(t)
		})
	}
}

// assertReleased fails the test if a goroutine of a daemon's parts is still running a moment
// after its release (connections' loops end asynchronously).
func assertReleased(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, frame := range owned {
		for proctest.Goroutines(frame) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := proctest.Goroutines(frame); n > 0 {
			t.Errorf("%d goroutines in %s still running: not released", n, frame)
		}
	}
}

// TestCheckerRunsUntilClose: a started checker answers checks and publishes their decisions;
// Close stops it, drains the decisions to the stream, releases everything, and answers the same
// when called again.
func TestCheckerRunsUntilClose(t *testing.T) {
	instance := "until-close-" + time.Now().Format("150405.000000")
	instance = strings.ReplaceAll(instance, ".", "-")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A generous Redis deadline: the checks below assert exact decisions, and a new checker's
	// first check (its script compiled by Redis) must not be handed to the fail mode on a
	// loaded CI machine.
	d, err := daemon.StartChecker(ctx, daemon.CheckerConfig{Listen: "127.0.0.1:0", RulesFile: rulesFile(t), Redis: redisClient(),
		NATSURL: natsSrv.URL, InstanceID: instance, Publisher: publisher.Config{SpoolDir: t.TempDir()}, Logger: daemontest.Logger(),
		RedisTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, d.URL())
	user := "u-" + instance
	var allowed []bool
	for range 3 {
		resp, err := client.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
			Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/x"}))
		if err != nil {
			t.Fatal(err)
		}
		allowed = append(allowed, resp.Msg.Allowed)
	}
	if fmt.Sprint(allowed) != "[true true false]" {
		t.Errorf("three checks of a limit of 2: allowed %v, want [true true false]", allowed)
	}
	select {
	case <-d.Done():
		t.Fatal("Done closed while serving")
	default:
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	select {
	case <-d.Done():
	default:
		t.Error("Done still open after Close")
	}
	if err := d.Wait(); err != nil {
		t.Errorf("Wait after Close = %v, want nil", err)
	}
	if _, err := http.Get(d.URL() + "/healthz"); err == nil {
		t.Error("the check port still answers after Close")
	}
	assertReleased(t)
	published := 0
	for _, m := range natstest.Messages(t, natsSrv.JetStream(t), "QUOTAFLOW_DECISIONS") {
		if strings.Contains(string(m.Data()), instance) {
			published++
		}
	}
	if published == 0 {
		t.Errorf("no decision of %s in the stream after Close, want the three drained", instance)
	}
}

// TestStartAggregatorFailureReleases: an aggregator whose DSN is refused, or whose NATS holds
// fewer servers than the replicas asked, does not start and leaves no NATS connection behind.
func TestStartAggregatorFailureReleases(t *testing.T) {
	tests := []struct {
		name    string
		cfg     daemon.AggregatorConfig
		want    string
		wantErr any
	}{
		{"not a DSN", daemon.AggregatorConfig{ClickHouseDSN: "http://127.0.0.1:8123/quotaflow"}, "clickhouse://", new(*schema.DSNError)},
		{"more replicas than NATS servers", daemon.AggregatorConfig{Aggregator: aggregator.Config{Replicas: 3}}, "replicas", new(*broker.ReplicasError)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cfg := tt.cfg
			cfg.NATSURL, cfg.Logger = natsSrv.URL, daemontest.Logger()
			if cfg.ClickHouseDSN == "" {
				cfg.ClickHouseDSN = "clickhouse://" + closedAddr(t) + "/quotaflow"
			}
			d, err := daemon.StartAggregator(ctx, cfg)
			if err == nil {
				d.Close()
				t.Fatal("StartAggregator = nil error, want one")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("StartAggregator error = %q, want it to contain %q", err, tt.want)
			}
			if !errors.As(err, tt.wantErr) {
				t.Errorf("StartAggregator error = %v, want it to wrap %T", err, tt.wantErr)
			}
			assertReleased(t)
		})
	}
}

// TestAggregatorStartsWithoutClickHouse: ClickHouse down is an outage the aggregator rides out
// (nothing acked, JetStream keeps the backlog), not a failed start; Close still releases it.
func TestAggregatorStartsWithoutClickHouse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := daemon.StartAggregator(ctx, daemon.AggregatorConfig{NATSURL: natsSrv.URL, Listen: "127.0.0.1:0",
		ClickHouseDSN: "clickhouse://" + closedAddr(t) + "/quotaflow", Logger: daemontest.Logger()})
	if err != nil {
		t.Fatalf("StartAggregator with ClickHouse down = %v, want it started", err)
	}
	resp, err := http.Get(d.URL() + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /readyz with NATS up = %v, %v; want 200", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	assertReleased(t)
}
