package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDevRefusesBusyPorts runs `make dev`'s script (deploy/dev/run.sh) with its check port and
// its ClickHouse HTTP port held by other servers — one answering HTTP, as another checker on
// 8080 would: it stops before building or starting anything, naming each busy address and the
// variable that moves it, instead of printing its banner over a server that is not its own.
func TestDevRefusesBusyPorts(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer other.Close()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	listen, chHTTP := other.Listener.Addr().String(), held.Addr().String()
	_, chHTTPPort, _ := net.SplitHostPort(chHTTP)
	_, redisPort, _ := net.SplitHostPort(freeAddr(t))
	_, chPort, _ := net.SplitHostPort(freeAddr(t))
	dir := t.TempDir()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../../deploy/dev/run.sh")
	cmd.Env = append(os.Environ(), "QUOTAFLOW_DEV_DIR="+dir, "QUOTAFLOW_LISTEN="+listen,
		"QUOTAFLOW_NATS_LISTEN="+freeAddr(t), "QUOTAFLOW_DEV_REDIS_PORT="+redisPort,
		"QUOTAFLOW_DEV_CLICKHOUSE_PORT="+chPort, "QUOTAFLOW_DEV_CLICKHOUSE_HTTP_PORT="+chHTTPPort)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("run.sh with busy ports: %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	for _, want := range []string{
		listen + " is in use (set QUOTAFLOW_LISTEN to another)",
		"127.0.0.1:" + chHTTPPort + " is in use (set QUOTAFLOW_DEV_CLICKHOUSE_HTTP_PORT to another)",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if got := strings.Count(stderr.String(), "is in use"); got != 2 {
		t.Errorf("%d ports said busy, want 2 (the free ones are not):\n%s", got, stderr.String())
	}
	if out := stdout.String(); strings.Contains(out, "building") || strings.Contains(out, "ready") || strings.Contains(out, "running") {
		t.Errorf("run.sh built or started something with its ports busy:\n%s", out)
	}
	if _, err := os.Stat(dir + "/redis"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run.sh made %s/redis (err %v): it started before checking its ports", dir, err)
	}
}
