package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
)

// TestCheckerExposure: with a callers file, the check port describes no services unless
// --reflection on says so, and --metrics-listen moves /metrics off the check port.
func TestCheckerExposure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n- {id: two, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 2, window: 1h}\n"), 0o600)
	callersPath := filepath.Join(dir, "callers.yaml")
	os.WriteFile(callersPath, []byte("anonymous: {permissions: [check]}\n"), 0o600)
	tests := []struct {
		name        string
		args        []string
		wantReflect bool
		metricsOwn  bool
		adminOwn    bool
	}{
		{"callers file", nil, false, false, false},
		{"callers file, --reflection on, --metrics-listen", []string{"--reflection", "on", "--metrics-listen", "METRICS"}, true, true, false},
		{"callers file, --admin-listen", []string{"--admin-listen", "ADMIN", "--admin-token", "exposure-admin-token-0123"}, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, metrics, adminAddr := freeAddr(t), freeAddr(t), freeAddr(t)
			args := []string{"checker", "--listen", addr, "--rules", rulesPath, "--callers-file", callersPath, "--redis-url", redisSrv.URL(3)}
			for _, a := range tt.args {
				args = append(args, strings.NewReplacer("METRICS", metrics, "ADMIN", adminAddr).Replace(a))
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			var out bytes.Buffer
			go func() { done <- run(ctx, args, env(nil), &out, &out) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("checker: %v\n%s", err, out.String())
				}
			}()
			poll.Until(t, 10*time.Second, "the checker ready", ready("http://"+addr))

			for _, opts := range [][]connect.ClientOption{{connect.WithGRPC()}, {connect.WithGRPCWeb()}} {
				// A connection of its own each: the port sorts a connection once, by its first
				// request, to grpc-go or net/http.
				hc := checkertest.H2CClient()
				defer hc.CloseIdleConnections()
				stream := grpcreflect.NewClient(hc, "http://"+addr, opts...).NewStream(context.Background())
				names, err := stream.ListServices()
				stream.Close()
				if got := err == nil && len(names) > 0; got != tt.wantReflect {
					t.Errorf("reflection: ListServices = %v, %v; want served %v", names, err, tt.wantReflect)
				}
			}

			if got := getStatus(t, "http://"+addr+"/metrics"); tt.metricsOwn == (got == 200) {
				t.Errorf("GET /metrics on the check port: %d", got)
			}
			if tt.metricsOwn {
				if got := getStatus(t, "http://"+metrics+"/metrics"); got != 200 {
					t.Errorf("GET /metrics on --metrics-listen: %d, want 200", got)
				}
			}
			// The admin API answers where it is served (503 here: no NATS for its store); the
			// check port without it has no such path (404), nor the console.
			if got := getStatus(t, "http://"+addr+"/api/v1/rules"); tt.adminOwn != (got == 404) {
				t.Errorf("GET /api/v1/rules on the check port: %d (admin on its own port: %v)", got, tt.adminOwn)
			}
			if tt.adminOwn {
				if got := getStatus(t, "http://"+adminAddr+"/api/v1/rules"); got == 404 {
					t.Errorf("GET /api/v1/rules on --admin-listen: %d, want the admin API's answer", got)
				}
				if got := getStatus(t, "http://"+adminAddr+"/console/"); got != 200 {
					t.Errorf("GET /console/ on --admin-listen: %d, want 200", got)
				}
				if got := getStatus(t, "http://"+addr+"/console/"); got != 404 {
					t.Errorf("GET /console/ on the check port with --admin-listen: %d, want 404", got)
				}
			}
		})
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// ready is the condition that base's /readyz answers 200.
func ready(base string) func() error {
	return func() error {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}
}

// TestServingFlags: bad values are refused naming the flag.
func TestServingFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ flag, value, want string }{
		{"--reflection", "maybe", "--reflection: want on, off or auto"},
		{"--max-connections", "0", "--max-connections: want at least 1"},
		{"--max-request-bytes", "100", "--max-request-bytes: want at least 65536"},
		{"--idle-timeout", "0s", "--idle-timeout: want more than 0"},
		{"--read-timeout", "-1s", "--read-timeout: want more than 0"},
	} {
		_, stderr, code := runCmd(context.Background(), []string{"checker", "--rules", "x.yaml", tt.flag, tt.value}, nil)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s %s: exit %d, stderr %q; want 2 and %q", tt.flag, tt.value, code, stderr, tt.want)
		}
	}
}
