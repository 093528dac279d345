package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/certtest"
	"github.com/quotaflow/quotaflow/internal/testbed/clickhousetest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	"github.com/quotaflow/quotaflow/internal/tlsfiles"
)

// TestTLSEverywhere runs a checker that serves TLS with client certificates and reaches Redis
// (rediss://) and NATS (tls://) over TLS with its own CA: a check through all three works, and
// its decision is in the stream.
func TestTLSEverywhere(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "quotaflow-tls")
	redisCert, redisKey := ca.Server(t, "redis")
	rs, err := redistest.StartTLS(redisCert, redisKey, ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)

	natsCert, natsKey := ca.Server(t, "nats")
	natsTLS, err := tlsfiles.Server(natsCert, natsKey, "")
	if err != nil {
		t.Fatal(err)
	}
	natsTLS.NextProtos = nil
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		TLS: true, TLSConfig: natsTLS, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	natsURL := "tls://127.0.0.1:" + strconv.Itoa(ns.Addr().(*net.TCPAddr).Port)

	certFile, keyFile := ca.Server(t, "checker")
	clientCert, clientKey := ca.Client(t, "orders.internal")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"checker", "--listen", addr, "--redis-timeout", "5s", "--spool-dir", t.TempDir(),
			"--rules", writeFile(t, "rules.yaml", "rules:\n- {id: one, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1h}\n"),
			"--redis-url", rs.URL(0), "--redis-ca-file", ca.CertFile,
			"--nats-url", natsURL, "--nats-ca-file", ca.CertFile,
			"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", ca.CertFile,
			"--callers-file", writeFile(t, "callers.yaml", "callers: [{name: orders, certificate: orders.internal, permissions: [check]}]\n"),
		}, env(nil), io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("checker: %v", err)
		}
	})

	roots := x509.NewCertPool()
	pem, _ := os.ReadFile(ca.CertFile)
	roots.AppendCertsFromPEM(pem)
	kp, err := tls.LoadX509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{kp}}, ForceAttemptHTTP2: true}}
	base := "https://" + addr
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Get(base + "/readyz")
		if err == nil && resp.StatusCode == http.StatusOK {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checker not ready over TLS within 20s: %v", err)
		}
	}
	resp, err := hc.Post(base+"/quotaflow.v1.RateLimiter/CheckRateLimit", "application/json",
		strings.NewReader(`{"identifier":"tls-user","dimension":"DIMENSION_USER","endpoint":"/x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"allowed":true`) {
		t.Fatalf("check over TLS = %d %s, want allowed", resp.StatusCode, body)
	}

	// The decision reached the stream over NATS's TLS.
	nc, err := nats.Connect(natsURL, nats.RootCAs(ca.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := js.Stream(context.Background(), stream.Name)
		if err == nil {
			if info, err := st.Info(context.Background()); err == nil && info.State.Msgs > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no decision in the stream within 10s")
		}
	}
}

func TestTLSFlags(t *testing.T) {
	t.Parallel()
	rules := writeFile(t, "rules.yaml", "rules:\n- {id: one, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1h}\n")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"cert without key", []string{"--tls-cert", rules}, "--tls-cert and --tls-key: want both"},
		{"redis TLS files with redis://", []string{"--redis-url", "redis://127.0.0.1:1/0", "--redis-ca-file", rules}, "--redis-ca-file: needs a rediss:// --redis-url"},
		{"missing callers file", []string{"--callers-file", rules + ".gone"}, "--callers-file: " + rules + ".gone: open"},
		{"bad callers file", []string{"--callers-file", rules}, "--callers-file: " + rules + ": "},
		{"bad trusted proxy", []string{"--trusted-proxies", "10.0.0.0/8,banana"}, `"banana" is neither a CIDR nor an address`},
		{"dimension header without a name", []string{"--forward-auth-dimension-headers", "tenant=X-Tenant,X-Class"}, `--forward-auth-dimension-headers: "X-Class" is not name=header`},
		{"dimension header not a header", []string{"--forward-auth-dimension-headers", "tenant=X Tenant"}, `"tenant=X Tenant" is not name=header`},
	} {
		_, stderr, code := runCmd(context.Background(), append([]string{"checker", "--rules", rules, "--listen", "127.0.0.1:0"}, tt.args...), nil)
		if code != 2 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tt.name, code, stderr, tt.want)
		}
	}
}

// TestClickHouseTLS: migrate reaches Debian's clickhouse-server over its TLS port with the
// project's CA (DSN ?secure=true, --clickhouse-ca-file), and refuses a server its CA does not
// vouch for.
func TestClickHouseTLS(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "quotaflow-ch")
	cert, key := ca.Server(t, "clickhouse")
	ch, err := clickhousetest.StartTLS(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Close)
	dsn := "clickhouse://" + ch.SecureAddr + "/tls_migrate?secure=true&dial_timeout=5s"
	stdout, stderr, code := runCmd(context.Background(), []string{"migrate", "--clickhouse-dsn", dsn, "--clickhouse-ca-file", ca.CertFile}, nil)
	if code != 0 || !strings.Contains(stdout, "database tls_migrate: applied") {
		t.Fatalf("migrate over TLS: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	other := certtest.NewCA(t, "not-quotaflow")
	if _, stderr, code := runCmd(context.Background(), []string{"migrate", "--clickhouse-dsn", dsn, "--clickhouse-ca-file", other.CertFile}, nil); code == 0 {
		t.Errorf("migrate trusting another CA succeeded; stderr %q", stderr)
	}
}

// TestRedisTopologyFlags: a bad combination of topologies, or a cluster no seed of which
// answers, stops the start with an error naming the flag.
func TestRedisTopologyFlags(t *testing.T) {
	t.Parallel()
	rules := writeFile(t, "rules.yaml", "rules:\n- {id: one, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1h}\n")
	for _, tt := range []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"two topologies", []string{"--redis-cluster", "127.0.0.1:1", "--redis-sentinel", "127.0.0.1:2", "--redis-sentinel-master", "m"}, 2, "--redis-cluster: not with --redis-sentinel (name one Redis topology"},
		{"a URL and a cluster", []string{"--redis-url", "redis://127.0.0.1:1/0", "--redis-cluster", "127.0.0.1:1"}, 2, "--redis-url: not with --redis-cluster"},
		{"sentinels without a master", []string{"--redis-sentinel", "127.0.0.1:2"}, 2, "--redis-sentinel: needs --redis-sentinel-master"},
		{"a master without sentinels", []string{"--redis-sentinel-master", "m"}, 2, "--redis-sentinel-master: needs --redis-sentinel"},
		{"credentials with a URL", []string{"--redis-password", "secret"}, 2, "--redis-password: for --redis-cluster or --redis-sentinel"},
		{"an unreachable seed list", []string{"--redis-cluster", "127.0.0.1:1,127.0.0.1:2"}, 1, "--redis-cluster: no server answered at start"},
		{"unreachable sentinels", []string{"--redis-sentinel", "127.0.0.1:1", "--redis-sentinel-master", "m"}, 1, "--redis-sentinel: no server answered at start"},
	} {
		_, stderr, code := runCmd(context.Background(), append([]string{"checker", "--rules", rules, "--listen", "127.0.0.1:0"}, tt.args...), nil)
		if code != tt.wantCode || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", tt.name, code, stderr, tt.wantCode, tt.want)
		}
	}
}
