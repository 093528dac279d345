package ts_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	"github.com/quotaflow/quotaflow/internal/urlpath"
)

var redisSrv *redistest.Server

// onCluster: make test-cluster runs ./checker/... again on a Redis Cluster. The TypeScript client
// knows nothing of the checker's Redis, whose topologies the Go packages test, so its tests run
// once, on one server.
var onCluster = os.Getenv("QUOTAFLOW_TEST_REDIS") == "cluster"

func TestMain(m *testing.M) {
	if onCluster {
		os.Exit(m.Run())
	}
	os.Exit(redistest.Main(m, &redisSrv))
}

// rules are the checker's for the TypeScript tests (test/*.test.ts name them).
const rules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: ts-exact, dimension: user, endpoint: /exact, algorithm: fixed_window, limit: 50, window: 1h}
  - {id: ts-orders, dimension: user, endpoint: /orders, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: ts-short, dimension: user, endpoint: /short, algorithm: fixed_window, limit: 1, window: 1s}
  - {id: ts-mw, dimension: user, endpoint: /mw/*, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: ts-llm, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 1000, window: 1h}
  - {id: ts-inflight, dimension: user, endpoint: /stream, algorithm: concurrency, limit: 1, window: 1m}
  - {id: ts-tenant, dimension: tenant, endpoint: /reports, algorithm: fixed_window, limit: 2, window: 1h}
  - {id: ts-bench, dimension: user, endpoint: /bench, algorithm: fixed_window, limit: 1000000000, window: 1h}
entitlements:
  - {id: tokens, dimension: user, period: 1mo}
`

func skipOnCluster(t *testing.T) {
	if onCluster {
		t.Skip("the TypeScript client's tests run once, on one Redis server (make test runs them)")
	}
}

// The npm steps run once per test binary, shared by the tests that need node_modules or dist.
var (
	npmOnce sync.Once
	npmErr  error
	binOnce sync.Once
	binPath string
	binErr  error
)

// npmReady installs node_modules from package-lock.json (unless what is installed was installed
// from this very lock file) and builds dist and dist-test.
func npmReady(t *testing.T) {
	t.Helper()
	npmOnce.Do(func() { npmErr = installAndBuild() })
	if npmErr != nil {
		t.Fatal(npmErr)
	}
}

func installAndBuild() error {
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("npm not found: install Node.js 20 and npm (the machine's own): %w", err)
	}
	lock, err := os.ReadFile("package-lock.json")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(lock)
	stamp := filepath.Join("node_modules", ".quotaflow-lock-sha256")
	if b, err := os.ReadFile(stamp); err != nil || string(b) != hex.EncodeToString(sum[:]) {
		if out, err := run(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"); err != nil {
			return fmt.Errorf("npm ci: %w\n%s", err, out)
		}
		if err := os.WriteFile(stamp, []byte(hex.EncodeToString(sum[:])), 0o644); err != nil {
			return err
		}
	}
	// go test ./... walks node_modules too: a package there with Go files would be built and
	// vetted as the module's own.
	var goFiles []string
	filepath.WalkDir("node_modules", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			goFiles = append(goFiles, path)
		}
		return nil
	})
	if len(goFiles) > 0 {
		return fmt.Errorf("node_modules holds Go files, which go test ./... and go vet ./... would take for the module's: %v", goFiles)
	}
	if out, err := run(npm, "run", "build", "--silent"); err != nil {
		return fmt.Errorf("npm run build: %w\n%s", err, out)
	}
	return nil
}

func run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	return cmd.CombinedOutput()
}

// quotaflowBinary builds cmd/quotaflow once: the checkers of these tests are the real program.
func quotaflowBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "quotaflow-ts-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "quotaflow")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		// -trimpath: the build cache then serves any clone of the repository, wherever it is.
		if out, err := run(goTool, "build", "-trimpath", "-o", binPath, "github.com/quotaflow/quotaflow/cmd/quotaflow"); err != nil {
			binErr = fmt.Errorf("go build cmd/quotaflow: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// checker is a `quotaflow checker` process on a loopback port it keeps across kills.
type checker struct {
	URL string
	*proctest.Process
}

// startChecker runs `quotaflow checker` with the rules on database db of the test Redis until
// the test ends.
func startChecker(t *testing.T, db int) *checker {
	t.Helper()
	c, err := newChecker(quotaflowBinary(t), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newChecker is startChecker for a caller that is no test goroutine: the caller closes it.
func newChecker(bin string, db int) (*checker, error) {
	return proctest.Start("checker", 1, func(p *proctest.Process, dir string, ports []int) (*checker, proctest.Config, error) {
		file := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
			return nil, proctest.Config{}, err
		}
		addr := proctest.Addr(ports[0])
		c := &checker{URL: "http://" + addr, Process: p}
		return c, proctest.Config{
			Name: "quotaflow checker",
			Path: bin,
			Args: []string{"checker", "--listen", addr, "--rules", file, "--redis-url", redisSrv.URL(db),
				"--redis-timeout", "5s", "--log-level", "error", "--health-interval", "-1s"},
			Output:  os.Stderr,
			Ready:   ready(c.URL),
			Timeout: 20 * time.Second,
		}, nil
	})
}

func ready(base string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
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

// control serves the Node tests what they cannot do themselves: checkers of their own, killed
// (SIGKILL) and started again on the same port.
//
//	POST /checkers               → {"id": 1, "url": "http://127.0.0.1:port"}
//	POST /checkers/{id}/kill     → 204
//	POST /checkers/{id}/start    → 204, once it is ready
func control(t *testing.T, db int) string {
	t.Helper()
	var mu sync.Mutex
	var checkers []*checker
	mux := http.NewServeMux()
	bin := quotaflowBinary(t)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range checkers {
			c.Close()
		}
	})
	mux.HandleFunc("POST /checkers", func(w http.ResponseWriter, r *http.Request) {
		c, err := newChecker(bin, db)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mu.Lock()
		checkers = append(checkers, c)
		id := len(checkers)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": id, "url": c.URL})
	})
	get := func(w http.ResponseWriter, r *http.Request) *checker {
		id, _ := strconv.Atoi(r.PathValue("id"))
		mu.Lock()
		defer mu.Unlock()
		if id < 1 || id > len(checkers) {
			http.Error(w, "no such checker", http.StatusNotFound)
			return nil
		}
		return checkers[id-1]
	}
	mux.HandleFunc("POST /checkers/{id}/kill", func(w http.ResponseWriter, r *http.Request) {
		if c := get(w, r); c != nil {
			c.Stop()
			w.WriteHeader(http.StatusNoContent)
		}
	})
	mux.HandleFunc("POST /checkers/{id}/start", func(w http.ResponseWriter, r *http.Request) {
		if c := get(w, r); c != nil {
			if err := c.Start(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestNode runs the package's own tests (test/*.test.ts, compiled) with Node's test runner
// against a real checker process on the test Redis: counts under concurrency, retries across a
// restart, the deny cache, the fail modes with the checker killed, reserve and settle, leases,
// balances, each middleware through real HTTP against forward-auth's answers, and bad
// configuration.
func TestNode(t *testing.T) {
	skipOnCluster(t)
	t.Parallel()
	npmReady(t)
	c := startChecker(t, 1)
	ctl := control(t, 1)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: install Node.js 20 (the machine's own)")
	}
	files, err := filepath.Glob(filepath.Join("dist-test", "test", "*.test.js"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no compiled tests in dist-test/test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Two files at once: the machine's cores are shared with the rest of the suite.
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-concurrency=2", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "QF_CHECKER_URL="+c.URL, "QF_CONTROL_URL="+ctl, "QF_RUN_ID="+runID(), "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("node --test: %v (its output is above)", err)
	}
}

// runID keeps the subjects of one run apart from those of earlier runs on the same Redis.
func runID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36)
}

// TestPathCases: test/urlpath-cases.json, which the TypeScript client's normalizePath is
// tested against (test/urlpath.test.ts), says what the checker's own normal form
// (internal/urlpath) says of each path: its form, or its refusal word for word.
func TestPathCases(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("test/urlpath-cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ In, Out, Err string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		out, err := urlpath.Normalize(c.In)
		var msg string
		if err != nil {
			msg = err.Error()
		}
		if out != c.Out || msg != c.Err {
			t.Errorf("urlpath.Normalize(%q) = %q, %q; the file says %q, %q", c.In, out, msg, c.Out, c.Err)
		}
	}
}

// TestGeneratedCurrent: src/gen is what buf and protoc-gen-es, as package-lock.json pins them,
// generate from proto/ (npm run generate writes it; commit the result).
func TestGeneratedCurrent(t *testing.T) {
	skipOnCluster(t)
	t.Parallel()
	npmReady(t)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join("node_modules", ".bin", "buf"), "generate", "--output", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, b)
	}
	want := map[string][]byte{}
	filepath.WalkDir(filepath.Join(out, "src", "gen"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(out, path)
			want[rel], _ = os.ReadFile(path)
		}
		return nil
	})
	if len(want) == 0 {
		t.Fatal("buf generate wrote nothing")
	}
	got := map[string]bool{}
	filepath.WalkDir(filepath.Join("src", "gen"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			got[path] = true
			if w, ok := want[path]; !ok {
				t.Errorf("%s: not generated from proto/ any more: run npm run generate in checker/client/ts and commit", path)
			} else if b, _ := os.ReadFile(path); !bytes.Equal(b, w) {
				t.Errorf("%s differs from what buf generates: run npm run generate in checker/client/ts and commit", path)
			}
		}
		return nil
	})
	for path := range want {
		if !got[path] {
			t.Errorf("%s is generated but not committed: run npm run generate in checker/client/ts and commit", path)
		}
	}
}

// benchResult is one line of the benchmark's report.
type benchResult struct {
	Name         string  `json:"name"`
	Callers      int     `json:"callers"`
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	Errors       int     `json:"errors"`
}

// TestBenchmark (QUOTAFLOW_TS_BENCH=1; make bench-ts) measures checks/s and latency from one
// process against one checker process: the Go client, then the TypeScript client in one Node
// process (npm run bench), in the same run, each with 32 callers and each check its own subject.
func TestBenchmark(t *testing.T) {
	skipOnCluster(t)
	if os.Getenv("QUOTAFLOW_TS_BENCH") == "" {
		t.Skip("set QUOTAFLOW_TS_BENCH=1 (make bench-ts) to compare the Go and TypeScript clients")
	}
	npmReady(t)
	c := startChecker(t, 2)
	const callers, seconds = 32, 5
	var results []benchResult
	for _, tt := range []struct {
		name string
		wait time.Duration
	}{{"go coalesced", 0}, {"go single", -1}} {
		results = append(results, benchGo(t, c.URL, tt.name, tt.wait, callers, seconds))
	}
	cmd := exec.Command("npm", "run", "--silent", "bench")
	cmd.Env = append(os.Environ(), "QF_CHECKER_URL="+c.URL, "QF_BENCH_SECONDS="+strconv.Itoa(seconds), "QF_BENCH_CONCURRENCY="+strconv.Itoa(callers))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("npm run bench: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r benchResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("npm run bench printed %q: %v", line, err)
		}
		results = append(results, r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| client | callers | checks/s | p50 ms | p99 ms | errors |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %.2f | %d |\n", r.Name, r.Callers, r.ChecksPerSec, r.P50Ms, r.P99Ms, r.Errors)
	}
	t.Log(b.String())
}

// benchGo is the Go client's side of TestBenchmark.
func benchGo(t *testing.T, url, name string, wait time.Duration, callers, seconds int) benchResult {
	c := client.New(url, client.Config{BatchWait: wait, Timeout: 5 * time.Second})
	defer c.Close()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var n atomic.Int64
	var errs atomic.Int64
	measure := func(d time.Duration) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		end := time.Now().Add(d)
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				var mine []time.Duration
				for time.Now().Before(end) {
					t0 := time.Now()
					req := client.Request{Subjects: []client.Subject{{Dimension: client.User, ID: "bench-" + run + "-" + strconv.FormatInt(n.Add(1), 10)}}, Endpoint: "/bench"}
					d, err := c.Check(context.Background(), req)
					if err != nil || !d.Allowed || d.Source != client.SourceChecker {
						errs.Add(1)
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		return lat
	}
	measure(time.Second) // warm-up, as the Node side has
	start := time.Now()
	lat := measure(time.Duration(seconds) * time.Second)
	took := time.Since(start).Seconds()
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	return benchResult{Name: name, Callers: callers, ChecksPerSec: float64(len(lat)) / took, P50Ms: q(0.5), P99Ms: q(0.99), Errors: int(errs.Load())}
}
