package bucket

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig names where the buckets live: one server (URL), a Redis Cluster (Cluster, its
// seed nodes) or a Sentinel group (Sentinels and MasterName). Exactly one topology is named.
type RedisConfig struct {
	// URL is a standalone server's redis:// or rediss:// URL (credentials and database in it).
	URL string
	// Cluster lists seed nodes (host:port) of a Redis Cluster; the client learns the rest.
	Cluster []string
	// Sentinels lists the sentinels (host:port) of the group watching MasterName.
	Sentinels  []string
	MasterName string
	// Username and Password authenticate to the cluster's nodes or the group's servers (a URL
	// carries its own).
	Username, Password string
	// TLS, when set, is the TLS the servers are reached with; with a URL it replaces the one a
	// rediss:// URL implies (and needs rediss://), the server named as the URL's host unless
	// TLS names one.
	TLS *tls.Config
}

// ErrTopology is a RedisConfig that names no topology, or two.
var ErrTopology = errors.New("bucket: name one Redis topology: a URL, cluster seeds, or sentinels with a master name")

// dialerRetries is how many times go-redis dials a server that refused: once. Its default (5,
// 100 ms apart, per attempt of a cluster pipeline) spends a check's whole deadline on a dead
// master, while the check's other masters have answered and their charges wait to be refunded;
// the engine's probe finds the server again when it is back.
const dialerRetries = 1

// NewRedisClient returns a client of the topology cfg names, configured as the engine needs:
// context deadlines enforced (without it go-redis ignores them, and a stalled Redis stalls
// every check). It does not contact Redis.
func NewRedisClient(cfg RedisConfig) (redis.UniversalClient, error) {
	named := 0
	for _, set := range []bool{cfg.URL != "", len(cfg.Cluster) > 0, len(cfg.Sentinels) > 0} {
		if set {
			named++
		}
	}
	switch {
	case named != 1:
		return nil, ErrTopology
	case len(cfg.Sentinels) > 0 && cfg.MasterName == "":
		return nil, fmt.Errorf("%w: sentinels without a master name", ErrTopology)
	case cfg.MasterName != "" && len(cfg.Sentinels) == 0:
		return nil, fmt.Errorf("%w: a master name without sentinels", ErrTopology)
	}
	switch {
	case len(cfg.Cluster) > 0:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.Cluster, Username: cfg.Username, Password: cfg.Password,
			TLSConfig: cfg.TLS, ContextTimeoutEnabled: true, DialerRetries: dialerRetries}), nil
	case len(cfg.Sentinels) > 0:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.MasterName, SentinelAddrs: cfg.Sentinels,
			Username: cfg.Username, Password: cfg.Password, TLSConfig: cfg.TLS, ContextTimeoutEnabled: true,
			DialerRetries: dialerRetries}), nil
	}
	if !strings.HasPrefix(cfg.URL, "redis://") && !strings.HasPrefix(cfg.URL, "rediss://") {
		return nil, fmt.Errorf("want a redis:// or rediss:// URL, got %q", cfg.URL)
	}
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	opts.DialerRetries = dialerRetries
	if cfg.TLS != nil {
		if opts.TLSConfig == nil {
			return nil, errors.New("TLS files need a rediss:// URL")
		}
		serverName := opts.TLSConfig.ServerName // the URL's host, which its certificate names
		opts.TLSConfig = cfg.TLS
		if cfg.TLS.ServerName == "" {
			opts.TLSConfig = cfg.TLS.Clone()
			opts.TLSConfig.ServerName = serverName
		}
	}
	return redis.NewClient(opts), nil
}

// ErrNoAnswer is Client's error when no server of a cluster or a Sentinel group answered.
var ErrNoAnswer = errors.New("no server answered at start")

// Client returns a client of cfg's topology (NewRedisClient). A Redis Cluster or a Sentinel
// group must answer within 5s, or Client fails with ErrNoAnswer: a wrong seed list is an
// error, not a degraded state. One server is not contacted: it may be down at start, its
// rules' fail modes deciding meanwhile.
func (cfg RedisConfig) Client(ctx context.Context) (redis.UniversalClient, error) {
	rdb, err := NewRedisClient(cfg)
	if err != nil || cfg.URL != "" {
		return rdb, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := reachable(ctx, rdb); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return rdb, nil
}

// reachable reports whether the topology answers: for a cluster, a seed node that knows the
// slot map; for a Sentinel group, a sentinel that knows the master; for one server, a PING.
func reachable(ctx context.Context, rdb redis.UniversalClient) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ClusterShards(ctx).Err()
	default:
		return rdb.Ping(ctx).Err()
	}
}
