package transport

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
)

// The reference service the differential test compares with, as deploy/dev/install-deps.sh
// installs it (go install of this version of its module, which also leaves its example
// configuration in the module cache).
const (
	envoyRatelimitModule  = "github.com/envoyproxy/ratelimit"
	envoyRatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

// TestEnvoyReferenceAgreement feeds envoyproxy/ratelimit and quotaflow a configuration
// (quotaflow through rules import-envoy's conversion), both on real Redis, and the same
// generated sequence of ShouldRateLimit requests, and requires the same answer to every one:
// overall code, and per descriptor the code, the limit (requests, unit, name), the remaining
// count and the seconds until reset, and the response headers. The configurations are the
// reference's own example (value-less keys, replaces, unlimited, shadow mode, a ban) and
// testdata/envoy's (wildcards, hours and days, value-less keys under values). The sequence is
// random (its seed is logged; QUOTAFLOW_ENVOY_SEED replays one) over each configuration's own
// paths (envoyGen), with several descriptors per request and hits_addend of 0 to 3 per
// request and per descriptor.
func TestEnvoyReferenceAgreement(t *testing.T) {
	bin, example := envoyReference(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("QUOTAFLOW_ENVOY_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (QUOTAFLOW_ENVOY_SEED replays it)", seed)
	for _, tc := range []struct{ name, dir string }{{"example", example}, {"wildcards", "testdata/envoy"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			agreeWithReference(t, bin, tc.dir, seed)
		})
	}
}

func agreeWithReference(t *testing.T, bin, configDir string, seed uint64) {
	run := strings.ToLower(id(t, "e")) // domains are matched in normal form: lower case
	// The configuration as it is, but for its domains, which are this run's: quotaflow counts
	// on the package's Redis (a cluster under make test-cluster), which other runs share.
	root := envoyRuntime(t, configDir, run)
	doc, err := rules.ImportEnvoy(filepath.Join(root, "ratelimit", "config"))
	if err != nil {
		t.Fatal(err)
	}
	set, err := doc.Compile()
	if err != nil {
		t.Fatalf("the converted configuration: %v", err)
	}
	gen := newEnvoyGen(seed, run, doc)
	env := newEnv(t, checker.Config{Rules: set})
	refRedis, _ := ownRedis(t)
	ref := startEnvoyReference(t, bin, root, refRedis.Addr)
	qf := grpcRLSClient(t, strings.TrimPrefix(env.url, "http://"))

	// A minute boundary between the two servers' answers would split a minute window's
	// counts: run inside one minute, starting with 20s of it left at least, and stopping
	// before its last second however far a slow machine got.
	if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 20*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
	minuteEnds := time.Now().Truncate(time.Minute).Add(time.Minute - time.Second)
	const n = 600
	ctx := t.Context()
	compared, over, limited, sent := 0, 0, 0, 0
	var quietFrom int64 // the first second in which per-second windows compare again after a split
	for i := range n {
		if time.Now().After(minuteEnds) {
			break
		}
		sent++
		req := gen.request()
		t0 := time.Now().Unix()
		want, err := ref.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("request %d to the reference %v: %v", i, req, err)
		}
		got, err := qf.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("request %d to quotaflow %v: %v", i, req, err)
		}
		t1 := time.Now().Unix()
		if t1 != t0 {
			// The second turned between the answers: their seconds until reset differ, and a
			// per-second count may be split between two windows until the next second.
			quietFrom = t1 + 1
			continue
		}
		if t0 < quietFrom && (perSecond(want) || perSecond(got)) {
			continue
		}
		compared++
		if want.GetOverallCode() == ratelimitv3.RateLimitResponse_OVER_LIMIT {
			over++
		}
		for _, st := range want.GetStatuses() {
			if st.GetCurrentLimit() != nil {
				limited++
			}
		}
		if !proto.Equal(normalRLS(got), normalRLS(want)) {
			t.Fatalf("request %d: %v\n got (quotaflow) %v\nwant (reference) %v", i, req, got, want)
		}
	}
	t.Logf("%d of %d requests compared (the rest straddled a second, or followed one with a per-second limit), %d over the limit, %d descriptor statuses with a limit", compared, sent, over, limited)
	if compared < 150 || over < compared/10 || limited < compared/2 {
		t.Errorf("compared %d requests (%d over the limit, %d limited statuses): the sequence tested too little", compared, over, limited)
	}
}

// perSecond reports whether a status of r has a limit per second.
func perSecond(r *ratelimitv3.RateLimitResponse) bool {
	for _, st := range r.GetStatuses() {
		if st.GetCurrentLimit().GetUnit() == ratelimitv3.RateLimitResponse_RateLimit_SECOND {
			return true
		}
	}
	return false
}

// normalRLS is r with its headers in a stable order.
func normalRLS(r *ratelimitv3.RateLimitResponse) *ratelimitv3.RateLimitResponse {
	c := proto.Clone(r).(*ratelimitv3.RateLimitResponse)
	hs := c.ResponseHeadersToAdd
	for i := range hs {
		for j := i + 1; j < len(hs); j++ {
			if hs[j].Key < hs[i].Key {
				hs[i], hs[j] = hs[j], hs[i]
			}
		}
	}
	return c
}

// envoyGen generates requests from a configuration's own rules (rules.ImportEnvoy's): each
// descriptor follows one rule's path, its entries' values the rule's (exact, or a wildcard's
// prefix and more), another value (a miss), or one of a few per value-less key; some are cut
// short, some go deeper than the tree, some have keys no rule names.
type envoyGen struct {
	rnd     *rand.Rand
	run     string // makes the value-less keys' values this run's
	paths   map[string][][]rules.DocEntry
	domains []string
}

func newEnvoyGen(seed uint64, run string, doc *rules.Document) *envoyGen {
	g := &envoyGen{rnd: rand.New(rand.NewPCG(seed, 1)), run: run, paths: map[string][][]rules.DocEntry{}}
	for _, r := range doc.Rules {
		d := strings.TrimPrefix(r.Endpoint, "/")
		if g.paths[d] == nil {
			g.domains = append(g.domains, d)
		}
		g.paths[d] = append(g.paths[d], r.Descriptor)
	}
	slices.Sort(g.domains)
	return g
}

func (g *envoyGen) pick(vs ...string) string { return vs[g.rnd.IntN(len(vs))] }

// value is a value of a value-less key: few, so that they repeat and reach their limits, and
// now and then one with the bytes keys must survive.
func (g *envoyGen) value() string {
	if g.rnd.IntN(20) == 0 {
		return "{odd}:" + g.run + ":" + strings.Repeat("v", 1+g.rnd.IntN(200))
	}
	return g.pick("a", "b", "c") + g.run
}

func entries(kv ...string) []*rlcommonv3.RateLimitDescriptor_Entry {
	es := make([]*rlcommonv3.RateLimitDescriptor_Entry, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		es = append(es, &rlcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func (g *envoyGen) descriptor(domain string) *rlcommonv3.RateLimitDescriptor {
	paths := g.paths[domain]
	path := paths[g.rnd.IntN(len(paths))]
	var kv []string
	for _, e := range path {
		v := e.Value
		switch {
		case v == "" || g.rnd.IntN(8) == 0:
			v = g.value() // a value-less key's value, or a miss
		case strings.HasSuffix(v, "*"):
			v = strings.TrimSuffix(v, "*") + g.pick("", "x", g.run) // the wildcard's prefix and more
		}
		kv = append(kv, e.Key, v)
	}
	switch g.rnd.IntN(12) {
	case 0:
		kv = kv[:max(2, len(kv)-2)] // cut short
	case 1:
		kv = append(kv, "extra", g.value()) // deeper than the tree
	case 2:
		kv = []string{"unknown", g.value()} // a key no rule names
	}
	d := &rlcommonv3.RateLimitDescriptor{Entries: entries(kv...)}
	if g.rnd.IntN(4) == 0 {
		d.HitsAddend = wrapperspb.UInt64(uint64(g.rnd.IntN(4)))
	}
	return d
}

func (g *envoyGen) request() *ratelimitv3.RateLimitRequest {
	domain := g.domains[g.rnd.IntN(len(g.domains))]
	r := &ratelimitv3.RateLimitRequest{Domain: domain, HitsAddend: uint32(g.pick("0", "0", "0", "1", "2")[0] - '0')}
	for range 1 + g.rnd.IntN(3) {
		r.Descriptors = append(r.Descriptors, g.descriptor(domain))
	}
	return r
}

// envoyReference finds the reference service's binary and its example configuration, which
// deploy/dev/install-deps.sh installs.
func envoyReference(t *testing.T) (bin, configDir string) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	paths := strings.Fields(string(out))
	bin = filepath.Join(strings.Split(paths[0], string(os.PathListSeparator))[0], "bin", "service_cmd")
	configDir = filepath.Join(paths[1], envoyRatelimitModule+"@"+envoyRatelimitVersion, "examples", "ratelimit", "config")
	for _, p := range []string{bin, configDir} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("envoyproxy/ratelimit %s is not installed (%v): run deploy/dev/install-deps.sh", envoyRatelimitVersion, err)
		}
	}
	return bin, configDir
}

// envoyRuntime copies configDir's files into a runtime directory of the reference's layout
// (root/ratelimit/config), each domain made domain-run, and returns root.
func envoyRuntime(t *testing.T, configDir, run string) string {
	t.Helper()
	root := t.TempDir()
	dst := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(configDir, "*.yaml"))
	domain := regexp.MustCompile(`(?m)^domain: (\S+)$`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = domain.ReplaceAll(data, []byte("domain: ${1}-"+run))
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// startEnvoyReference runs the reference service on the runtime directory root and the Redis at
// addr, with its rate limit headers on, and returns a client of its gRPC port.
func startEnvoyReference(t *testing.T, bin, root, redisAddr string) ratelimitv3.RateLimitServiceClient {
	t.Helper()
	ports, err := proctest.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
		fmt.Sprintf("PORT=%d", ports[0]), fmt.Sprintf("GRPC_PORT=%d", ports[1]), fmt.Sprintf("DEBUG_PORT=%d", ports[2]))
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("reference service's output:\n%s", logs.String())
		}
	})
	c := grpcRLSClient(t, fmt.Sprintf("127.0.0.1:%d", ports[1]))
	probe := &ratelimitv3.RateLimitRequest{Domain: "probe", Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: entries("k", "v")}}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := c.ShouldRateLimit(ctx, probe)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reference service did not answer: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func grpcRLSClient(t testing.TB, addr string) ratelimitv3.RateLimitServiceClient {
	t.Helper()
	if u, err := url.Parse("http://" + addr); err == nil {
		addr = u.Host
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return ratelimitv3.NewRateLimitServiceClient(cc)
}
