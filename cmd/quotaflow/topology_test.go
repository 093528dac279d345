package main

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

const topologyRules = `rules:
- {id: user-five, dimension: user, endpoint: /x, algorithm: fixed_window, limit: 5, window: 1h}
- {id: ip-two, dimension: ip, endpoint: /x, algorithm: gcra, limit: 2, window: 1h}
`

// admitted counts how many of n checks of user (and ip, when set) the checker allows.
func admitted(t *testing.T, c quotaflowv1connect.RateLimiterClient, n int, user, ip string) int {
	t.Helper()
	req := &quotaflowv1.CheckRateLimitRequest{Endpoint: "/x", Subjects: []*quotaflowv1.Subject{{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: user}}}
	if ip != "" {
		req.Subjects = append(req.Subjects, &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_IP, Identifier: ip})
	}
	allowed := 0
	for range n {
		resp, err := c.CheckRateLimit(context.Background(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Degraded {
			t.Fatalf("degraded answer: %v", resp.Msg)
		}
		if resp.Msg.Allowed {
			allowed++
		}
	}
	return allowed
}

func used(t *testing.T, c quotaflowv1connect.RateLimiterClient, user string) int64 {
	t.Helper()
	resp, err := c.GetRemainingQuota(context.Background(), connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
		Identifier: user, Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/x"}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.CurrentCount
}

// The package's Redis Cluster and Sentinel group, started by the first test that needs each and
// shared by the tests that do not change their shape; TestMain closes them.
var (
	clusterOnce, sentinelOnce sync.Once
	pkgCluster                *redistest.Cluster
	pkgSentinel               *redistest.Sentinel
	clusterErr, sentinelErr   error
)

func sharedCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	clusterOnce.Do(func() { pkgCluster, clusterErr = redistest.StartCluster(3, 1) })
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return pkgCluster
}

func sharedSentinel(t *testing.T) *redistest.Sentinel {
	t.Helper()
	sentinelOnce.Do(func() { pkgSentinel, sentinelErr = redistest.StartSentinel(2) })
	if sentinelErr != nil {
		t.Fatal(sentinelErr)
	}
	return pkgSentinel
}

func closeTopologies() {
	if pkgCluster != nil {
		pkgCluster.Close()
	}
	if pkgSentinel != nil {
		pkgSentinel.Close()
	}
}

// redisTopologies name each Redis topology the checker runs on, with the flags that name it.
var redisTopologies = []struct {
	name  string
	flags func(t *testing.T) []string
}{
	{"standalone", func(t *testing.T) []string { return []string{"--redis-url", redisSrv.URL(4)} }},
	{"cluster", func(t *testing.T) []string {
		return []string{"--redis-cluster", strings.Join(sharedCluster(t).Seeds(), ",")}
	}},
	{"sentinel", func(t *testing.T) []string {
		sg := sharedSentinel(t)
		return []string{"--redis-sentinel", strings.Join(sg.SentinelAddrs, ","), "--redis-sentinel-master", sg.MasterName}
	}},
}

// TestCheckerOnCluster: the checker command on a 3-master Redis Cluster, named by its seeds,
// admits exactly the limit, and a check whose subjects live on different masters charges
// none of them when one denies.
func TestCheckerOnCluster(t *testing.T) {
	t.Parallel()
	cl := sharedCluster(t)
	base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", topologyRules),
		Redis: redisOf(t, bucket.RedisConfig{Cluster: cl.Seeds()})}).URL()
	c := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, base)
	if got := admitted(t, c, 8, checkertest.ID(t, "solo"), ""); got != 5 {
		t.Errorf("%d of 8 checks admitted on the cluster, want the limit 5", got)
	}

	// Subjects whose buckets live on different masters.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	userKey := func(u string) string { return "rl:{user:" + u + "}:fw:1h:/x" }
	ip := checkertest.IP(t, "ip")
	ipMaster, err := cl.MasterOf(ctx, "rl:{ip:"+ip+"}:gcra:1h:/x")
	if err != nil {
		t.Fatal(err)
	}
	user := ""
	for i := range 64 {
		u := checkertest.ID(t, "multi-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		m, err := cl.MasterOf(ctx, userKey(u))
		if err != nil {
			t.Fatal(err)
		}
		if m.Addr != ipMaster.Addr {
			user = u
			break
		}
	}
	if user == "" {
		t.Fatal("no user key on another master than the IP's")
	}
	if got := admitted(t, c, 2, user+"-other", ip); got != 2 { // spends the IP's 2
		t.Fatalf("%d of 2 checks admitted while the IP had room", got)
	}
	if got := admitted(t, c, 3, user, ip); got != 0 {
		t.Errorf("%d checks admitted past the IP's limit, want 0", got)
	}
	if n := used(t, c, user); n != 0 {
		t.Errorf("user %s on another master was charged %d by checks its IP denied, want 0", user, n)
	}
}

// TestCheckerOnSentinel: the checker command on a Sentinel group, named by its sentinels and
// master, admits exactly the limit.
func TestCheckerOnSentinel(t *testing.T) {
	t.Parallel()
	sg := sharedSentinel(t)
	base := daemontest.Checker(t, daemon.CheckerConfig{RulesFile: writeFile(t, "rules.yaml", topologyRules),
		Redis: redisOf(t, bucket.RedisConfig{Sentinels: sg.SentinelAddrs, MasterName: sg.MasterName})}).URL()
	c := quotaflowv1connect.NewRateLimiterClient(http.DefaultClient, base)
	if got := admitted(t, c, 8, checkertest.ID(t, "solo"), ""); got != 5 {
		t.Errorf("%d of 8 checks admitted through the sentinels, want the limit 5", got)
	}
}
