package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// startCheckerProcess runs `quotaflow checker` as a child process and waits until it is ready.
func startCheckerProcess(t *testing.T, rulesPath, redisURL string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "checker", "--listen", addr, "--rules", rulesPath, "--redis-url", redisURL,
		"--redis-timeout", "5s", "--log-level", "warn")
	cmd.Env = append(os.Environ(), asCheckerEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Errorf("checker process %s did not stop on SIGINT", addr)
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return "http://" + addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("checker process on %s not ready: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExactAcrossProcesses: three checker processes share one Redis; 300 concurrent checks of
// one key spread over them admit exactly the limit, for each exact algorithm.
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
	var clients []quotaflowv1connect.RateLimiterClient
	for i := 0; i < 3; i++ {
		clients = append(clients, quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, startCheckerProcess(t, rulesPath, redisSrv.URL(4))))
	}
	user := "procs-" + time.Now().Format("150405.000000")
	for _, a := range algorithms {
		t.Run(a, func(t *testing.T) {
			var allowed, failed atomic.Int64
			var wg sync.WaitGroup
			for i := 0; i < checks; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := clients[i%len(clients)].CheckRateLimit(context.Background(), connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
						Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/" + a}))
					switch {
					case err != nil || resp.Msg.Degraded:
						failed.Add(1)
					case resp.Msg.Allowed:
						allowed.Add(1)
					}
				}()
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
}
