package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// When the test binary is started with this variable set, it is `quotaflow checker`: the
// multi-process test runs real checker processes without building the binary separately.
const asCheckerEnv = "QUOTAFLOW_TEST_AS_CHECKER"

func init() {
	if os.Getenv(asCheckerEnv) == "1" {
		main()
	}
}

// checkerProcess is `quotaflow checker` in a child process.
type checkerProcess struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startCheckerProcess runs `quotaflow checker` with args as a child process and waits until it
// is ready; it is interrupted (SIGINT) at the end of the test unless killed before.
func startCheckerProcess(t *testing.T, args ...string) *checkerProcess {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], append([]string{"checker", "--listen", addr, "--redis-timeout", "5s", "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), asCheckerEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &checkerProcess{url: "http://" + addr, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			t.Errorf("checker process %s did not stop on SIGINT", addr)
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(p.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("checker process exited at start")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("checker process on %s not ready: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill is kill -9.
func (p *checkerProcess) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// TestExactAcrossProcesses: three checker processes share one Redis — a server, a cluster or a
// Sentinel group; 300 concurrent checks of one key spread over them admit exactly the limit,
// for each exact algorithm.
func TestExactAcrossProcesses(t *testing.T) {
	t.Parallel()
	const limit, checks = 40, 300
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	doc := "rules:\n"
	algorithms := []string{"fixed_window", "token_bucket", "gcra", "sliding_window_log"}
	for _, a := range algorithms {
		doc += fmt.Sprintf("- {id: %s, dimension: user, endpoint: /%s, algorithm: %s, limit: %d, window: 1h}\n", a, a, a, limit)
	}
	if err := os.WriteFile(rulesPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, topo := range redisTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			var clients []quotaflowv1connect.RateLimiterClient
			for range 3 {
				p := startCheckerProcess(t, append([]string{"--rules", rulesPath}, topo.flags(t)...)...)
				clients = append(clients, quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, p.url))
			}
			user := "procs-" + time.Now().Format("150405.000000")
			for _, a := range algorithms {
				t.Run(a, func(t *testing.T) {
					var allowed, failed atomic.Int64
					var wg sync.WaitGroup
					for i := range checks {
						wg.Go(func() {
							resp, err := clients[i%len(clients)].CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
								Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/" + a}))
							switch {
							case err != nil || resp.Msg.Degraded:
								failed.Add(1)
							case resp.Msg.Allowed:
								allowed.Add(1)
							}
						})
					}
					wg.Wait()
					if failed.Load() > 0 {
						t.Fatalf("%d checks failed or were degraded", failed.Load())
					}
					if got := allowed.Load(); got != limit {
						t.Errorf("%d concurrent checks over 3 processes admitted %d, want exactly %d", checks, got, limit)
					}
				})
			}
		})
	}
}

// TestKill9LossBound: kill -9 of a publishing checker under load loses no answered decision,
// and the stream holds none twice. Three checkers in turn run on one spool and are killed; a
// fourth drains it. A check is answered only once its decision is written to the spool file
// (--spool-wait), which the page cache keeps when the process dies.
//
// With --spool-wait 0 (the behaviour before) a kill loses what is only in memory: the open
// batches and the spool's write buffer, about one flush interval of decisions; the test
// allows those answered in the last 100ms, for a loaded CI machine's scheduling delays.
func TestKill9LossBound(t *testing.T) {
	t.Parallel()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte(pipelineRules), 0o600)
	const flush = 5 * time.Millisecond
	tests := []struct {
		name  string
		wait  string
		kills int
	}{
		{"spool-wait=100ms", "100ms", 3},
		{"spool-wait=0", "0", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spool := t.TempDir()
			instance := "kill9-" + strings.TrimSuffix(tt.wait, "ms") + "-" + time.Now().Format("150405000")
			args := []string{"--rules", rulesPath, "--redis-url", redisSrv.URL(6), "--nats-url", natsSrv.URL,
				"--spool-dir", spool, "--instance-id", instance, "--publish-flush", flush.String(), "--spool-wait", tt.wait}
			answered := map[string]time.Time{}
			var lastFlushes, last100ms int
			for run := range tt.kills {
				killedAt := loadAndKill(t, startCheckerProcess(t, args...), fmt.Sprintf("%s-%d", instance, run), answered)
				for _, at := range answered {
					if at.After(killedAt.Add(-4*flush)) && !at.After(killedAt) {
						lastFlushes++
					}
					if at.After(killedAt.Add(-100*time.Millisecond)) && !at.After(killedAt) {
						last100ms++
					}
				}
			}
			// The next run on the same spool publishes what the killed ones had spooled;
			// stopping it (SIGINT) drains everything.
			next := startCheckerProcess(t, args...)
			next.cmd.Process.Signal(os.Interrupt)
			<-next.done

			inStream := map[string]int{}
			for _, d := range streamDecisions(t, natsSrv.URL, instance) {
				inStream[d.Id]++
			}
			lost, twice := 0, 0
			for id := range answered {
				if inStream[id] == 0 {
					lost++
				}
			}
			for _, n := range inStream {
				if n > 1 {
					twice++
				}
			}
			t.Logf("%d kill -9 under load: %d decisions answered, %d lost, %d in the stream twice; %d answered in the last %v and %d in the last 100ms before a kill",
				tt.kills, len(answered), lost, twice, lastFlushes, 4*flush, last100ms)
			if twice > 0 {
				t.Errorf("%d decisions in the stream twice, want each once", twice)
			}
			switch {
			case len(answered) == 0:
				t.Fatal("no check answered before the kills")
			case tt.wait != "0" && lost != 0:
				t.Errorf("%d kill -9 lost %d answered decisions, want 0", tt.kills, lost)
			case lost > last100ms:
				t.Errorf("kill -9 lost %d decisions, more than the %d answered in the last 100ms", lost, last100ms)
			}
		})
	}
}

// loadAndKill runs checks from 4 goroutines against p for 400ms, kills it (kill -9) and
// returns when; answered gets the decision id of each answered check and when it was.
func loadAndKill(t *testing.T, p *checkerProcess, users string, answered map[string]time.Time) (killedAt time.Time) {
	t.Helper()
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, p.url)
	var mu sync.Mutex
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if w%2 == 1 { // batches, whose decisions the spool takes together
					req := &quotaflowv1.CheckRateLimitsRequest{}
					for k := range 8 {
						req.Checks = append(req.Checks, userCheck(fmt.Sprintf("%s-%d-%d", users, w, (8*i+k)%100)).Msg)
					}
					resp, err := client.CheckRateLimits(context.Background(), connect.NewRequest(req))
					if err != nil {
						continue // the process is gone
					}
					mu.Lock()
					for _, r := range resp.Msg.Results {
						if id := r.GetResponse().GetDecisionId(); id != "" {
							answered[id] = time.Now()
						}
					}
					mu.Unlock()
					continue
				}
				resp, err := client.CheckRateLimit(context.Background(), userCheck(fmt.Sprintf("%s-%d-%d", users, w, i%100)))
				if err != nil {
					continue // the process is gone
				}
				mu.Lock()
				answered[resp.Msg.DecisionId] = time.Now()
				mu.Unlock()
			}
		})
	}
	// Under load 400ms since its start, and at least 50 answers: a loaded CI machine may be
	// slow to get a new process's first answers out.
	time.Sleep(400 * time.Millisecond)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(answered)
		mu.Unlock()
		if n >= 50 {
			break
		}
	}
	killedAt = time.Now()
	p.kill()
	stop()
	wg.Wait()
	return killedAt
}
