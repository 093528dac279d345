package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/testbed/poll"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// TestServeNATSAuth attacks `quotaflow serve`'s embedded NATS as the issue did: a bare
// connection is refused, and with a checker's credentials neither a forged override nor a
// rewritten rules document (an exemption) is stored, so the limit holds; the admin API still
// changes the limit, and watch reads the change with the operator's credentials.
func TestServeNATSAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rulesPath := writeFile(t, "rules.yaml", pipelineRules)
	addr, natsAddr, token := freeAddr(t), freeAddr(t), testToken()
	natsDir := filepath.Join(dir, "nats")
	args := []string{"serve", "--listen", addr, "--rules", rulesPath, "--redis-url", redisSrv.URL(5),
		"--nats-listen", natsAddr, "--nats-dir", natsDir, "--spool-dir", filepath.Join(dir, "spool"), "--admin-token", token}
	ctx, cancel := context.WithCancel(context.Background())
	var logMu sync.Mutex
	var logBuf bytes.Buffer
	w := lockedWriter{&logMu, &logBuf}
	logs := func() string { logMu.Lock(); defer logMu.Unlock(); return logBuf.String() }
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(nil), w, w) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop")
		}
	})
	client := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, "http://"+addr)
	poll.Until(t, 30*time.Second, "serve answering", serving(t, client, done, logs))
	natsURL := "nats://" + natsAddr
	auth := filepath.Join(natsDir, "auth")

	for _, role := range natsauth.Roles {
		st, err := os.Stat(natsauth.SeedFile(auth, role))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s's seed: %v, mode %v; want 0600", role, err, st.Mode().Perm())
		}
	}
	if st, err := os.Stat(auth); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the credentials folder: %v; want mode 0700", err)
	}

	if nc, err := nats.Connect(natsURL); err == nil {
		nc.Close()
		t.Error("a bare nats.Connect was accepted")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("a bare nats.Connect: %v, want an authorization violation", err)
	}

	js := roleJetStream(t, natsURL, natsauth.SeedFile(auth, natsauth.Checker))
	user := fmt.Sprintf("mallory-%d", time.Now().UnixNano())
	forged, _ := json.Marshal(map[string]any{"id": "forged", "dimension": "user", "identifier": user, "limit": 50,
		"reason": "x", "creator": "ops", "source": "admin", "created_at": time.Now(), "expires_at": time.Now().Add(time.Hour)})
	exempt := `{"doc":{"rules":[{"id":"user-min","dimension":"user","endpoint":"/api/*","algorithm":"fixed_window","limit":5,"window":"1h"}],"exemptions":[{"id":"x","dimension":"user","value":"` + user + `"}]}}`
	for _, w := range []struct{ bucket, key, value string }{
		{rulestore.OverrideBucket, "forged", string(forged)},
		{rulestore.ConfigBucket, "ruleset", exempt},
	} {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		kv, err := js.KeyValue(wctx, w.bucket)
		if err == nil {
			_, err = kv.Put(wctx, w.key, []byte(w.value))
		}
		wcancel()
		if err == nil {
			t.Errorf("a checker's credentials wrote %s/%s", w.bucket, w.key)
		}
	}
	if got := allowedOf(t, client, user, 10); got != 5 {
		t.Errorf("after the forged writes %s was allowed %d of 10, want the rule's 5", user, got)
	}

	body, _ := json.Marshal(map[string]any{"id": "raise-" + user, "rule_id": "user-min", "limit": 8, "duration": "10m", "reason": "the admin API still writes"})
	req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/users/"+user+"/override", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST override through the admin API = %d %s", resp.StatusCode, msg)
	}
	for deadline := time.Now().Add(5 * time.Second); peekLimit(t, client, user, "/api/items") != 8; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the admin API's override is not enforced within 5s")
		}
	}

	var out bytes.Buffer
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	err = run(wctx, []string{"watch", "overrides", "--all", "--count", "1", "--nats-url", natsURL,
		"--nats-creds", natsauth.SeedFile(auth, natsauth.Operator)}, env(nil), &out, io.Discard)
	if err != nil || !strings.Contains(out.String(), "raise-"+user) {
		t.Errorf("watch overrides as the operator: %v\n%s", err, out.String())
	}
}

// roleJetStream is a JetStream client of url authenticated by the credentials file creds.
func roleJetStream(t *testing.T, url, creds string) jetstream.JetStream {
	t.Helper()
	o, err := broker.CredentialsOption(creds)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, o, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// allowedOf makes n checks of user on /api/items and returns how many were allowed.
func allowedOf(t *testing.T, client quotaflowv1connect.RateLimiterClient, user string, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		resp, err := client.CheckRateLimit(context.Background(), userCheck(user))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Allowed {
			allowed++
		}
	}
	return allowed
}

// serving is the condition that the check API answers; it fails the test with the logs if serve
// exits first.
func serving(t *testing.T, client quotaflowv1connect.RateLimiterClient, done <-chan error, logs func() string) func() error {
	req := connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{Identifier: "probe",
		Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/api/items"})
	return func() error {
		select {
		case err := <-done:
			t.Fatalf("serve exited at start: %v\n%s", err, logs())
		default:
		}
		if _, err := client.GetRemainingQuota(context.Background(), req); err != nil {
			return fmt.Errorf("%w\n%s", err, logs())
		}
		return nil
	}
}
